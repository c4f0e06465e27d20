"""The `clotho` command."""

from __future__ import annotations

import typer

from clotho import __version__
from clotho.cli.api_cmd import api_command
from clotho.cli.bench_cmd import app as bench_app
from clotho.cli.check_cmd import check_command
from clotho.cli.env_cmd import evaluate_command, process_command
from clotho.cli.eval_cmd import eval_command
from clotho.cli.export_cmd import app as export_app
from clotho.cli.generate_cmd import generate_command
from clotho.cli.sandbox_cmd import app as sandbox_app
from clotho.cli.serve_cmd import serve_command
from clotho.cli.serve_model_cmd import serve_model_command
from clotho.cli.swe_cmd import app as swe_app
from clotho.cli.view_cmd import view_command

app = typer.Typer(
    name="clotho",
    help="Run LLM agents with tools in sandboxes and verify their work with each task's tests.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("eval")(eval_command)
app.command("check")(check_command)
app.command("process")(process_command)
app.command("serve")(serve_command)
app.command("evaluate")(evaluate_command)
app.command("api")(api_command)
app.command("serve-model")(serve_model_command)
app.command("view")(view_command)
app.command("generate")(generate_command)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(bench_app, name="bench")
app.add_typer(swe_app, name="swe")
app.add_typer(export_app, name="export")


@app.command()
def version() -> None:
    """Print the clotho version."""
    print(__version__)


if __name__ == "__main__":
    app()
