"""`python -m clotho` is the `clotho` command."""

from clotho.cli.main import app

app()
