"""Where a server's token comes from, for `clotho api` and `clotho serve-model`.

A token on the command line is visible to every user of the machine (`ps`, /proc), and a
printed one lands in terminal scrollback and service logs. So a token is read from a file
(`--token-file`) or an environment variable (`--token-env`, or the command's default
variable), and the servers print only where they read it. A token the server makes itself
is written to a file only its user can read, removed when the server stops.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from clotho.errors import ConfigError

MAX_TOKEN_FILE_BYTES = 4096
"""A token file larger than this is a wrong path, not a token."""

VISIBLE_ON_COMMAND_LINE = (
    "--token puts the token where every user of this machine can read it (ps); "
    "prefer --token-file or --token-env"
)


@dataclass(frozen=True)
class TokenSource:
    """A token and where it was read from: the origin is what gets printed, never the token."""

    token: str
    origin: str
    warnings: tuple[str, ...] = ()


def resolve_token(
    *,
    token: str | None,
    token_file: Path | None,
    token_env: str | None,
    default_env: str,
    environ: Mapping[str, str] | None = None,
) -> TokenSource | None:
    """The token given by at most one of `--token-file`, `--token-env` and `--token`, else
    from `default_env` when it is set; None when there is none. Mistakes are `ConfigError`s
    naming the flag to fix."""
    env = os.environ if environ is None else environ
    given = [
        flag
        for flag, value in (
            ("--token-file", token_file),
            ("--token-env", token_env),
            ("--token", token),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise ConfigError(f"give the token one way, not {' and '.join(given)}")
    if token_file is not None:
        return read_token_file(token_file)
    if token_env is not None:
        value = env.get(token_env)
        if not value:
            raise ConfigError(f"--token-env {token_env}: that environment variable is not set")
        return TokenSource(checked(value, f"${token_env}"), f"the environment variable {token_env}")
    if token is not None:
        return TokenSource(checked(token, "--token"), "--token", (VISIBLE_ON_COMMAND_LINE,))
    value = env.get(default_env)
    if value:
        return TokenSource(
            checked(value, f"${default_env}"), f"the environment variable {default_env}"
        )
    return None


def print_source(console: Console, source: TokenSource) -> None:
    """Where the server's token was read from (never the token), and what is unsafe about it."""
    console.print(f"token: read from {escape(source.origin)}", soft_wrap=True)
    for warning in source.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)


def read_token_file(path: Path) -> TokenSource:
    """The token in `path` (surrounding whitespace dropped). A pipe works too
    (`--token-file <(pass show clotho)`); a file others can read gets a warning."""
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            data = file.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"--token-file {path}: cannot read it: {exc.strerror}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ConfigError(
            f"--token-file {path}: more than {MAX_TOKEN_FILE_BYTES} bytes: not a token file"
        )
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"--token-file {path}: not ASCII text") from None
    warnings: tuple[str, ...] = ()
    if stat.S_ISREG(mode) and mode & 0o077:
        warnings = (f"{path} can be read by other users: chmod 600 {path}",)
    return TokenSource(checked(text, f"--token-file {path}"), f"the file {path}", warnings)


def checked(value: str, where: str) -> str:
    """`value` without surrounding whitespace, if it can travel in an HTTP header."""
    token = value.strip()
    if not token:
        raise ConfigError(f"{where}: the token is empty")
    if any(not 0x21 <= ord(c) <= 0x7E for c in token):
        raise ConfigError(
            f"{where}: a token is one word of printable ASCII (no spaces, no line breaks)"
        )
    return token


@contextmanager
def made_token_file(token: str, prefix: str) -> Iterator[Path]:
    """`token` in a new file only this user can read, in a new private folder; both are
    removed when the block ends (the token dies with the server)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))  # mode 0700
    try:
        path = folder / "token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(token + "\n")
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)
