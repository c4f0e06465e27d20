"""Shared fixtures: task directories made on the fly, and the bundled examples; and the rule
that under `CI=true` a skipped test is a failure."""

from __future__ import annotations

import os
import shutil
import signal
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

# Shared helper modules: their asserts are rewritten like a test module's (pytest's messages).
pytest.register_assert_rewrite(
    "tests.sandbox_fixtures",
    "tests.support",
    "tests.gateway_fixtures",
    "tests.gateway_helpers",
    "tests.model_helpers",
    "tests.swe_fixtures",
)

REPO = Path(__file__).resolve().parent.parent

# Tests send Ctrl-C (SIGINT) to the commands they start. A shell starts background jobs with
# SIGINT ignored, and an ignored signal stays ignored in every child: catch it here so that
# children start with the default (Python's KeyboardInterrupt), however pytest was launched.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
EXAMPLES = REPO / "examples" / "tasks"

IN_CI = os.environ.get("CI") == "true"


# --- under CI=true, a skip fails the run ----------------------------------------------------
# A guard that skips when a dependency is missing (bubblewrap, root, cgroups, Ray, the Atropos
# venv, a tokenizer...) lets a machine without it pass without judging. `make test` installs
# every dependency, so in CI any skip, at collection or in a test, whatever its guard, means a
# missing piece: the run fails and the summary names each skip with its reason. Outside CI the
# skips stay skips, with their reasons shown by `-ra`.
_ci_skips: list[str] = []


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _note_ci_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        _ci_skips.append(f"{report.nodeid}: {_skip_reason(report)}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_ci_skip(report)


# CLOTHO_TEST_TIMES=<file>: each test phase's duration appended as it ends (node id, phase,
# seconds), so a run cut short still tells where its time went.
_TIMES = os.environ.get("CLOTHO_TEST_TIMES")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_ci_skip(report)
    if _TIMES:
        with open(_TIMES, "a") as out:
            out.write(f"{report.nodeid}\t{report.when}\t{report.duration:.2f}\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _ci_skips and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _ci_skips:
        return
    terminalreporter.section("CI=true: skipped tests fail the run", sep="=", red=True, bold=True)
    terminalreporter.line(
        f"{len(_ci_skips)} tests were skipped; in CI every dependency is installed by `make test`, "
        "so each skip below names a missing piece:",
        red=True,
    )
    for line in _ci_skips:
        terminalreporter.line(f"  SKIPPED {line}", red=True)


requires_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (make test installs it)"
)

TaskFactory = Callable[..., Path]


@pytest.fixture
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture
def make_task(tmp_path: Path) -> TaskFactory:
    """Write a small Harbor task; by default the solution creates /app/done.txt with 'ok'."""

    def make(
        name: str = "t",
        *,
        category: str = "files",
        test_sh: str | None = None,
        solve_sh: str = "echo ok > /app/done.txt\n",
        instruction: str = "Write ok into /app/done.txt.",
        toml_extra: str = "",
        env_files: dict[str, str] | None = None,
        root: Path | None = None,
    ) -> Path:
        task = (root or tmp_path / "tasks") / name
        (task / "tests").mkdir(parents=True)
        (task / "solution").mkdir()
        (task / "environment").mkdir()
        (task / "task.toml").write_text(
            textwrap.dedent(
                f"""\
                version = "1.0"
                [metadata]
                category = "{category}"
                [verifier]
                timeout_sec = 30.0
                [agent]
                timeout_sec = 60.0
                """
            )
            + toml_extra
        )
        (task / "instruction.md").write_text(instruction)
        (task / "tests" / "test.sh").write_text(
            test_sh
            or textwrap.dedent(
                """\
                mkdir -p /logs/verifier
                if [ "$(cat /app/done.txt 2>/dev/null)" = ok ]; then echo 1; else echo 0; fi \\
                  > /logs/verifier/reward.txt
                """
            )
        )
        (task / "solution" / "solve.sh").write_text(solve_sh)
        for rel, content in (env_files or {}).items():
            target = task / "environment" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        return task

    return make


@pytest.fixture
async def docker() -> AsyncIterator[Any]:
    """A raw aiodocker client, to look at containers and images from outside the sandboxes."""
    from tests.docker_probe import DOCKER_PROBLEM

    if DOCKER_PROBLEM is not None:
        pytest.fail(f"CI=true runs the Docker tests, but no daemon answers: {DOCKER_PROBLEM}")
    import aiodocker

    client = aiodocker.Docker()
    try:
        yield client
    finally:
        await client.close()
