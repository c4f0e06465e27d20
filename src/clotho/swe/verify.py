"""Verification of a SWE instance, from nothing the agent controls.

After the agent: its processes are stopped; the programs the tests run are checked against
their digests from before the agent; then, only in fresh processes (`Sandbox.exec_fresh`),
the harness's own files arrive through stdin (pytest and the runner script, the pristine
`.git` of the base commit, the test ids, `test_patch`) into a folder made afresh; the
agent's diff against the base commit is taken with that pristine `.git` (the agent's own
`.git`, hooks and config are never used); the test files (those of `test_patch`, those the
listed tests live in, every conftest.py, pytest.ini, tox.ini and setup.cfg) are put back
as they were at the base commit, files the agent added under those names removed, and
`test_patch` applied; the listed tests run (`python3 -I`, our pytest, no third-party
plugins, no addopts) and write JUnit XML, read back as a regular file with a size cap.
Each listed test's outcome is recorded; one that was not collected counts as failed.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex
import tarfile
from importlib import metadata
from pathlib import Path
from typing import Literal

from clotho.errors import TamperError, VerifierError
from clotho.rollout.outcome import VerifierOutcome
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import DEFAULT_PATH
from clotho.swe.instance import SweInstance, SweOptions
from clotho.swe.log_parsers import OUTCOME, get_parser
from clotho.swe.repos import patch_files
from clotho.swe.runner import TestCase, outcomes, parse_junit, runner_files
from clotho.swe.specs import ResolvedSpec, registry
from clotho.verify.integrity import (
    ProgramDigests,
    VerifyWorld,
    check_links,
    fresh_exec,
    harness_dirs,
    image_openssl_config,
    verification_world,
)
from clotho.verify.loader_rules import REBUILD_LOADER_CACHE

WORK = "/tmp/clotho-swe"
JUNIT_MAX_BYTES = 32 << 20
DIFF_MAX_BYTES = 1 << 20
_PREP_TIMEOUT_S = 300.0
# Test command lines longer than this are split into chunks (ARG_MAX is 2 MiB here; a
# single argument may not exceed 128 KiB).
MAX_COMMAND_CHARS = 100_000
PROGRAMS = (
    "bash",
    "sh",
    "env",
    "python3",
    "python",
    "git",
    "tar",
    "find",
    "sed",
    "sort",
    "rm",
    "mkdir",
    "cat",
    "head",
    "stat",
    "patch",
    "ldconfig",  # rebuilds the loader's cache before the tests
    "ldconfig.real",  # what Ubuntu's `ldconfig` (a shell script) runs
)
HARNESS_FILES = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg")
# libcrypto reads the image's configuration, not the agent's (`integrity.OPENSSL_DEFAULTS`):
# one of the agent's loads providers by path as soon as the tests import hashlib.
OPENSSL_PIN = f"{WORK}/openssl.cnf"
TEST_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "OPENSSL_CONF": OPENSSL_PIN,
}
# A spec's command runs as its authors ran it: with the image's pytest plugins.
LOG_TEST_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "OPENSSL_CONF": OPENSSL_PIN}


def _path_dirs() -> list[str]:
    return [d for d in DEFAULT_PATH.split(":") if d.startswith("/")]


async def program_baseline(sandbox: Sandbox) -> ProgramDigests:
    """Taken before the agent starts, from outside the sandbox."""
    baseline = ProgramDigests(
        path_dirs=_path_dirs(),
        names=sorted(PROGRAMS),
        digests={},
        harness_dirs=harness_dirs(sandbox),
    )
    baseline.digests = await sandbox.digests(baseline.paths)
    baseline.openssl_conf = await image_openssl_config(sandbox)
    return baseline


def _git_tar(snapshot: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(snapshot / ".git", arcname="git")
    return buffer.getvalue()


def harness_tar(
    instance: SweInstance, snapshot: Path, restore: list[str], openssl_conf: bytes = b""
) -> bytes:
    """runner/ (pytest, run_tests.py), git/ (pristine), ids.json, test.patch, restore.lst,
    openssl.cnf (the image's)."""
    files = {f"runner/{k}": v for k, v in runner_files().items()}
    files["openssl.cnf"] = openssl_conf
    files["ids.json"] = json.dumps(instance.FAIL_TO_PASS + instance.PASS_TO_PASS).encode()
    files["test.patch"] = instance.test_patch.encode()
    files["restore.lst"] = "".join(f"{p}\n" for p in restore if "\n" not in p).encode()
    buffer = io.BytesIO(_git_tar(snapshot))
    with tarfile.open(fileobj=buffer, mode="a") as tar:
        for rel, data in files.items():
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def restore_list(instance: SweInstance) -> list[str]:
    """The test files the agent's version of must not be used."""
    paths = patch_files(instance.test_patch)
    for test in instance.FAIL_TO_PASS + instance.PASS_TO_PASS:
        path = test.split("::", 1)[0]
        if path.endswith(".py") and path not in paths and not path.startswith("/"):
            paths.append(path)
    return [p for p in paths if ".." not in p.split("/")]


def _git(testbed: str) -> str:
    return (
        f"git --git-dir={WORK}/git --work-tree={shlex.quote(testbed)} -c core.fsmonitor=false "
        "-c core.hooksPath=/dev/null -c core.quotepath=false "
        "-c core.autocrlf=false"
    )


def _prepare_script() -> str:
    return f"""set -eu
D={WORK}
if [ -L "$D" ] || {{ [ -e "$D" ] && [ ! -d "$D" ]; }}; then rm -f -- "$D"; fi
rm -rf -- "$D"
mkdir -p -- "$D"
tar -x --no-same-owner -C "$D"
mkdir -p -- "$D/out"
{REBUILD_LOADER_CACHE}"""


def _restore_script(testbed: str) -> str:
    g = _git(testbed)
    names = " -o ".join(f"-name {n}" for n in HARNESS_FILES)
    specs = " ".join(f"'*{n}'" for n in HARNESS_FILES)
    return f"""set -eu
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
D={WORK}
cd -- {shlex.quote(testbed)}
{g} add -A >/dev/null 2>&1 || true
{g} diff --cached --no-ext-diff --no-textconv --binary HEAD > "$D/out/agent.diff" || true
{{ cat "$D/restore.lst"
   find . -path ./.git -prune -o \\( {names} \\) -print | sed 's|^\\./||'
   {g} ls-files -- {specs}
}} | sort -u | while IFS= read -r f; do
  [ -n "$f" ] || continue
  rm -rf -- "$f"
  if {g} cat-file -e "HEAD:$f" 2>/dev/null; then {g} checkout -q HEAD -- "$f"; fi
done
if [ -s "$D/test.patch" ]; then {g} apply --whitespace=nowarn "$D/test.patch"; fi
"""


async def _fresh(sandbox: Sandbox, cmd: str, what: str, **kwargs: object) -> str:
    kwargs.setdefault("timeout", _PREP_TIMEOUT_S)
    return await fresh_exec(sandbox, cmd, what, **kwargs)


async def _read_capped(
    sandbox: Sandbox, path: str, cap: int, *, end: Literal["head", "tail"] = "head"
) -> str | None:
    """A regular file's text (None when missing or not a regular file), cut at `cap`: its
    first `cap` bytes, or with `end="tail"` its last (a runner's summary ends its log)."""
    quoted = shlex.quote(path)
    kind = await _fresh(
        sandbox,
        f"if [ -L {quoted} ] || [ ! -f {quoted} ]; then echo no; else echo yes; fi",
        f"inspect {path}",
    )
    if kind.strip() != "yes":
        return None
    return await _fresh(
        sandbox, f"{end} -c {cap} -- {quoted}", f"read {path}", max_output_bytes=cap + 1
    )


def _chunks(ids: list[str], template: str) -> list[list[str]]:
    chunks: list[list[str]] = [[]]
    size = len(template)
    for test in ids:
        cost = len(shlex.quote(test)) + 1
        if chunks[-1] and size + cost > MAX_COMMAND_CHARS:
            chunks.append([])
            size = len(template)
        chunks[-1].append(test)
        size += cost
    return chunks


async def _run_tests(
    instance: SweInstance, sandbox: Sandbox, testbed: str, timeout_s: float
) -> tuple[list[str], list[str], bool]:
    """(JUnit XML texts, output tails, timed out) of the listed tests."""
    listed = instance.FAIL_TO_PASS + instance.PASS_TO_PASS
    if instance.test_cmd:
        template = instance.test_cmd
        commands = []
        for i, chunk in enumerate(_chunks(listed, template)):
            tests = " ".join(shlex.quote(t) for t in chunk)
            junit = f"{WORK}/out/junit-{i}.xml"
            cmd = template.replace("{junit}", junit)
            cmd = cmd.replace("{tests}", tests) if "{tests}" in cmd else f"{cmd} {tests}"
            commands.append((cmd, junit))
    else:
        commands = [
            (
                f"exec python3 -I {WORK}/runner/run_tests.py {WORK}/ids.json {WORK}/out/junit-0.xml",
                f"{WORK}/out/junit-0.xml",
            )
        ]
    xmls: list[str] = []
    tails: list[str] = []
    timed_out = False
    for cmd, junit in commands:
        result = await sandbox.exec_fresh(
            f"exec 2>&1; {cmd}", timeout=timeout_s, env=TEST_ENV, cwd=testbed
        )
        await sandbox.stop_agent()  # whatever the tests started (the agent's code among it)
        tails.append((result.stdout + result.stderr)[-4000:])
        timed_out = timed_out or result.timed_out
        text = await _read_capped(sandbox, junit, JUNIT_MAX_BYTES)
        if text:
            xmls.append(text)
    return xmls, tails, timed_out


def log_command(instance: SweInstance, spec: ResolvedSpec | None) -> str:
    """The test command of a log-read run: the record's own (its {tests} filled with the
    listed ids; without {tests}, the spec's arguments, or else the listed ids appended) or
    the spec's test_cmd and arguments (SWE-bench: the test files of test_patch)."""
    listed = instance.FAIL_TO_PASS + instance.PASS_TO_PASS
    ids = " ".join(shlex.quote(t) for t in listed)
    if instance.test_cmd:
        if "{tests}" in instance.test_cmd:
            return instance.test_cmd.replace("{tests}", ids)
        if spec is None:
            return f"{instance.test_cmd} {ids}"
        base = instance.test_cmd
    else:
        assert spec is not None
        base = spec.test_cmd
    args = spec.arguments(instance)
    return " ".join([base, *(shlex.quote(a) for a in args)])


def _log_script(instance: SweInstance, spec: ResolvedSpec | None, testbed: str) -> str:
    """Environment (conda's testbed, the spec's eval commands, the install again when the
    reference harness does it), then the tests with their output in test.log. A `pytest`
    of our own comes last on PATH, for sandboxes whose image has none."""
    setup = [spec.activate, *spec.eval_commands] if spec is not None else []
    if spec is not None and spec.eval_install and spec.install:
        setup.append(spec.install)
    body = "\n".join(setup)
    # Our copy of pluggy has no dist-info to read its version from: the header asks for it.
    main = (
        f"import sys, pluggy, pytest; pluggy.__version__ = {metadata.version('pluggy')!r}; "
        "sys.exit(pytest.main())"
    )
    shim = (
        "#!/bin/sh\n"
        f'PYTHONPATH="{WORK}/runner${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'exec python3 -c {shlex.quote(main)} "$@"\n'
    )
    return f"""D={WORK}
mkdir -p "$D/bin" && printf '%s' {shlex.quote(shim)} > "$D/bin/pytest" && chmod 755 "$D/bin/pytest"
export PATH="$PATH:$D/bin"
{{
{body}
:
}} > "$D/out/setup.log" 2>&1 < /dev/null
cd -- {shlex.quote(testbed)}
{log_command(instance, spec)} > "$D/out/test.log" 2>&1 < /dev/null
echo $? > "$D/out/test.rc"
"""


async def _run_logged(
    instance: SweInstance,
    spec: ResolvedSpec | None,
    sandbox: Sandbox,
    testbed: str,
    timeout_s: float,
) -> tuple[list[TestCase], list[str], bool, str]:
    """(cases, output tails, timed out, parser) of a run whose outcomes are read from its
    log by the spec's (or the record's) log parser."""
    name = instance.log_parser or (spec.log_parser if spec else None) or "pytest"
    parse = get_parser(name)
    result = await sandbox.exec_fresh(
        _log_script(instance, spec, testbed), timeout=timeout_s, env=LOG_TEST_ENV, cwd=testbed
    )
    await sandbox.stop_agent()  # whatever the tests started (the agent's code among it)
    log = await _read_capped(sandbox, f"{WORK}/out/test.log", JUNIT_MAX_BYTES, end="tail")
    if log is None:
        detail = (result.stdout + result.stderr).strip()[-1500:]
        raise VerifierError(
            f"the test command left no log (exit code {result.exit_code}): {detail}"
        )
    setup = await _read_capped(sandbox, f"{WORK}/out/setup.log", 4000, end="tail") or ""
    rc = (await _read_capped(sandbox, f"{WORK}/out/test.rc", 16) or "").strip()
    found = parse(log)
    if not found and rc in ("126", "127") and not result.timed_out:
        raise VerifierError(
            f"the test command could not run (exit code {rc}): {log.strip()[-1500:]}"
        )
    cases = [
        TestCase(ids={test}, outcome=OUTCOME[status], nodeid=test) for test, status in found.items()
    ]
    tails = [f"$ {log_command(instance, spec)}", setup[-2000:], log[-6000:]]
    return cases, tails, result.timed_out, name


def reads_log(instance: SweInstance, spec: ResolvedSpec | None) -> bool:
    """Outcomes come from the log unless the record's own command writes JUnit XML
    ({junit}) or, with no command and no spec, clotho's runner does."""
    if instance.test_cmd:
        return "{junit}" not in instance.test_cmd
    return spec is not None


def score(
    instance: SweInstance, tests: dict[str, dict[str, str]], reward_mode: str
) -> tuple[float, dict[str, float]]:
    f2p = [tests[t]["outcome"] == "passed" for t in instance.FAIL_TO_PASS]
    p2p = [tests[t]["outcome"] == "passed" for t in instance.PASS_TO_PASS]
    fixed = sum(f2p) / len(f2p) if f2p else 1.0
    kept = sum(p2p) / len(p2p) if p2p else 1.0
    rewards = {"fail_to_pass": fixed, "pass_to_pass": kept}
    if reward_mode == "shaped":
        return (fixed if all(p2p) else 0.0), rewards
    return (1.0 if all(f2p) and all(p2p) else 0.0), rewards


# The test runner the outcomes come from (our pytest and its plugin system): code under test
# that names it is reaching into the process that records its verdict.
_RUNNER_NAMES = re.compile(
    r"\b(?:_pytest|pytest|pluggy|TestReport|CollectReport|runtestprotocol|junitxml|LogXML)\b"
)
_TEST_FILE = re.compile(  # restored from the base commit before the tests run
    r"(?:^|/)(?:tests?|testing)/|(?:^|/)test_[^/]*\.py$|_test\.py$"
    r"|(?:^|/)(?:conftest\.py|pytest\.ini|tox\.ini|setup\.cfg)$"
)


def runner_reach(diff: str, repo: str = "") -> list[str]:
    """The lines the agent's diff adds, outside test files (which verification restores), that
    name the test runner: a patch to the package under test that monkeypatches pytest's
    reports turns failures into passes from inside the recording process. Not for the test
    runner's own repositories, whose code is pytest."""
    if re.search(r"(?:^|/)(?:pytest|pluggy)$", repo):
        return []
    found: list[str] = []
    path = ""
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[4:].removeprefix("b/")
        elif line.startswith("+") and not _TEST_FILE.search(path) and _RUNNER_NAMES.search(line):
            found.append(f"{path}: {line[1:].strip()[:200]}")
    return found


async def verify_instance(
    instance: SweInstance,
    sandbox: Sandbox,
    snapshot: Path,
    options: SweOptions,
    baseline: ProgramDigests | None,
) -> VerifierOutcome:
    """The instance's verdict on what the agent left at the testbed (module docstring)."""
    async with verification_world(sandbox, baseline) as world:
        return await _judge(instance, world.sandbox, world, snapshot, options, baseline)


async def _judge(
    instance: SweInstance,
    sandbox: Sandbox,
    world: VerifyWorld,
    snapshot: Path,
    options: SweOptions,
    baseline: ProgramDigests | None,
) -> VerifierOutcome:
    """The tests run in `sandbox` (the world's), judged by the agent's changes."""
    testbed = options.testbed
    spec = registry(options.specs_files).resolve(instance)
    changes = world.changes
    openssl_conf = baseline.openssl_conf if baseline is not None else b""
    payload = await asyncio.to_thread(
        harness_tar, instance, snapshot, restore_list(instance), openssl_conf
    )
    await _fresh(sandbox, _prepare_script(), "prepare the verifier's folder", stdin=payload)
    await _fresh(sandbox, _restore_script(testbed), "restore the test files", timeout=600.0)
    # A link of the agent's landing in the harness's folder would read its files as the code's.
    await check_links(sandbox, baseline, changes, roots=(WORK,), fresh=(WORK,))
    diff = await _read_capped(sandbox, f"{WORK}/out/agent.diff", DIFF_MAX_BYTES) or ""
    if reach := runner_reach(diff, instance.repo):
        raise TamperError(
            "the agent's patch reaches into the test runner that records the outcomes ("
            + "; ".join(reach[:5])
            + "); the tests were not run"
        )
    if world.before_tests is not None:
        await world.before_tests()  # the agent's services serve the tests
    parser: str | None = None
    if reads_log(instance, spec):
        cases, tails, timed_out, parser = await _run_logged(
            instance, spec, sandbox, testbed, options.test_timeout_s
        )
    else:
        xmls, tails, timed_out = await _run_tests(
            instance, sandbox, testbed, options.test_timeout_s
        )
        if not xmls:  # the runner died before writing its report: no verdict, never a 0
            raise VerifierError(
                "the tests wrote no JUnit XML report; their output ends with: "
                + "\n".join(tails)[-1500:]
            )
        cases = []
        for xml in xmls:
            try:
                cases.extend(parse_junit(xml))
            except Exception as exc:  # the agent's code ran in the test process: its doing
                tails.append(f"unreadable JUnit XML: {type(exc).__name__}: {exc}")
    tests = outcomes(instance.FAIL_TO_PASS + instance.PASS_TO_PASS, cases)
    if timed_out:
        for entry in tests.values():
            if entry["outcome"] == "not collected":
                entry["outcome"] = "timed out"
    for test in instance.FAIL_TO_PASS:
        tests[test]["list"] = "FAIL_TO_PASS"
    for test in instance.PASS_TO_PASS:
        tests[test].setdefault("list", "PASS_TO_PASS")
    reward, rewards = score(instance, tests, options.reward)
    report = {
        "instance_id": instance.instance_id,
        "reward_mode": options.reward,
        "tests": tests,
        "not_collected": [t for t, e in tests.items() if e["outcome"] == "not collected"],
        "agent_diff": diff,
        "diff_truncated": len(diff.encode()) >= DIFF_MAX_BYTES,
        "runner_output": "\n".join(tails)[-8000:],
    }
    if parser is not None:
        report["log_parser"] = parser
        report["spec"] = spec.repo if spec is not None else None
    return VerifierOutcome(
        reward=reward,
        rewards=rewards,
        exit_code=0 if reward >= 1.0 else 1,
        output=json.dumps(report, indent=1),
    )
