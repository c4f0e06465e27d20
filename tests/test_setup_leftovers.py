"""What a test script sets up for itself, read from its text: the files it sources (however
the shell would spell them) and, of those the agent left first, what the harness removes
before the tests. Pure functions: the Docker runs are in test_verify_world.py."""

from __future__ import annotations

import pytest

from clotho.verify.integrity import ProgramDigests, named_paths

ENV = "/root/.local/bin/env"


@pytest.mark.parametrize(
    "script",
    [
        "source $HOME/.local/bin/env",
        'source "$HOME/.local/bin/env"',
        'source "${HOME}/.local/bin/env"',
        "if true; then source $HOME/.local/bin/env; fi",
        "for i in 1; do . ~/.local/bin/env; done",
        "curl -LsSf https://example.invalid/install.sh | sh && . $HOME/.local/bin/env",
    ],
)
def test_a_sourced_file_is_found_however_the_shell_spells_it(script: str) -> None:
    files, folders = named_paths(script)
    assert files == [ENV]
    assert "/root/.local/bin" in folders


def test_a_bin_folder_inside_a_quoted_command_is_still_named() -> None:
    files, folders = named_paths('bash -c "/root/.cargo/bin/cargo test"')
    assert files == [] and folders == ["/root/.cargo/bin"]


def _baseline(files: list[str], present: set[str], workdir: str = "/app") -> ProgramDigests:
    folders = sorted({f.rsplit("/", 1)[0] for f in files})
    names = ["uvx", "mytool", "bash"]
    paths = [*files, *(f"{d}/{n}" for d in folders for n in names)]
    digests = {p: ("sha256:" + "0" * 64 if p in present else None) for p in paths}
    return ProgramDigests(
        path_dirs=folders, names=names, digests=digests, files=files,
        runner=["uvx", "bash"], workdir=workdir,
    )  # fmt: skip


def test_only_what_was_absent_and_is_the_runners_is_a_leftover() -> None:
    baseline = _baseline([ENV], present={"/root/.local/bin/bash"})
    # The sourced file and the runner's `uvx` were absent; `bash` was there (its digest is
    # checked instead); `mytool` may be the task's own program.
    assert baseline.setup_leftovers() == [ENV, "/root/.local/bin/uvx"]


def test_nothing_in_the_workdir_is_a_leftover() -> None:
    """`source /app/venv/bin/activate`: the agent's venv is the work the tests judge."""
    baseline = _baseline(["/app/venv/bin/activate", ENV], present=set())
    leftovers = baseline.setup_leftovers()
    assert not [p for p in leftovers if p.startswith("/app/")]
    assert ENV in leftovers


def test_a_leftover_never_counts_as_shadowing_but_a_present_program_does() -> None:
    baseline = _baseline([ENV], present={"/root/.local/bin/bash"})
    now = dict(baseline.digests)
    now["/root/.local/bin/uvx"] = "sha256:" + "1" * 64  # removed before the tests anyway
    assert baseline.changes(now) == []
    now["/root/.local/bin/bash"] = "sha256:" + "2" * 64
    assert baseline.changes(now) == ["bash: /root/.local/bin/bash was replaced"]
