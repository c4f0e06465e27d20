"""What a local sandbox sees of the host: the system trees, an /etc of its own, its workspace,
and nothing else. A task's reference solution and tests, the checkout, the run folder, the
harness's virtualenv and world-readable files in new folders under / (and under /srv, /opt,
/var/tmp, /mnt) are not there, for the agent's shell nor for a fresh process, while the
sandbox's tools work; the harness's entries at `/` and /etc cannot be replaced or added to;
and a scripted model (a named test double) that finds solve.sh and runs it scores 0.
Real bubblewrap sandboxes, real `clotho eval`."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.conftest import EXAMPLES, REPO
from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call
from tests.test_eval_cli import clotho, results

from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.local.bwrap import BwrapSandbox
from clotho.sandbox.transfer import XFER_MOUNT

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    # Planting world-readable folders under / needs root (so do the overlay and sandbox uids).
    pytest.mark.skipif(os.geteuid() != 0, reason="planting folders under / needs root"),
]
ROOT_MODES = ["ro", "overlay"]
TASK = "access-log-summary"  # a bundled task: doing nothing scores 0, its solve.sh scores 1
# Every entry a sandbox may have at `/`: the system trees, its /etc, /dev, /proc, private and
# extra folders, its workspace and transfer folder. Nothing named after the host's data.
ALLOWED_TOP = {
    "bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "tmp", "run",
    "root", "home", "var", "opt", "app", XFER_MOUNT.strip("/"), "logs", "tests", "solution",
}  # fmt: skip
# What an administrator writes about a host (and its secrets): never in the sandbox's /etc.
HOST_ETC = (
    "pip.conf", "npmrc", "gitconfig", "environment", "profile", "profile.d", "apt", "ssh",
    "docker", "machine-id", "shadow", "gshadow", "sudoers", "subuid", "wgetrc", "ld.so.preload",
    "cron.d", "systemd", "security",
)  # fmt: skip


@dataclass
class Planted:
    """World-readable host data the sandbox must not see, all named after `token`."""

    token: str
    folders: list[Path] = field(default_factory=list)
    secrets: list[Path] = field(default_factory=list)
    task: Path = Path()
    run: Path = Path()


def _open_to_all(top: Path) -> None:
    for path in [top, *top.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture
def planted() -> Iterator[Planted]:
    token = secrets.token_hex(8)
    found = Planted(token)
    try:
        for parent in ("/", "/srv", "/opt", "/var/tmp", "/mnt"):
            if not os.path.isdir(parent):
                continue
            folder = Path(parent) / f"clotho-test-{token}"
            folder.mkdir()
            found.folders.append(folder)
            secret = folder / f"secret-{token}"
            secret.write_text(f"{token}\n")
            found.secrets.append(secret)
            _open_to_all(folder)
        top = found.folders[0]  # /clotho-test-<token>: a name no list of the host's has
        found.task = top / "tasks" / TASK
        shutil.copytree(EXAMPLES / TASK, found.task)
        found.run = top / "run"
        found.run.mkdir()
        (found.run / "results.jsonl").write_text(json.dumps({"token": token}) + "\n")
        _open_to_all(top)
        yield found
    finally:
        for folder in found.folders:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=ROOT_MODES)
def root_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def sandbox(root_mode: str, tmp_path: Path) -> AsyncIterator[BwrapSandbox]:
    sb = await open_sandbox(LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path / "s")))
    assert isinstance(sb, BwrapSandbox)
    try:
        yield sb
    finally:
        await sb.close()


def hidden_paths(planted: Planted) -> list[Path]:
    """Host paths that exist, readable by anyone, and must not exist in a sandbox."""
    paths = [
        *planted.secrets,
        planted.task / "solution" / "solve.sh",
        planted.task / "tests" / "check.py",
        planted.run / "results.jsonl",
        REPO,  # the checkout, with its bundled tasks' solutions and tests
        EXAMPLES / TASK / "solution" / "solve.sh",
        EXAMPLES / TASK / "tests" / "check.py",
    ]
    if not Path(sys.prefix).is_relative_to("/usr"):  # the harness's virtualenv
        paths.append(Path(sys.prefix) / "bin" / "python")
    for path in paths:
        assert path.exists(), path  # on the host: the test looks for something real
    return paths


def looking_script(planted: Planted) -> str:
    """Shell: name every hidden path that exists, and everything `find` reaches named
    solve.sh or after the token; then 'done'."""
    paths = " ".join(shlex.quote(str(p)) for p in hidden_paths(planted))
    return (
        f'for p in {paths}; do if [ -e "$p" ] || [ -L "$p" ]; then echo "visible: $p"; fi; done\n'
        f"find / \\( -name solve.sh -o -name '*{planted.token}*' \\) 2>/dev/null\n"
        "echo done\n"
    )


async def test_host_data_is_not_in_the_sandbox(sandbox: BwrapSandbox, planted: Planted) -> None:
    script = looking_script(planted)
    r = await sandbox.exec(script, timeout=300)
    assert r.stdout == "done\n", r.stdout
    # Not a closed door but nothing at all: the path does not exist inside.
    r = await sandbox.exec(f"cat {planted.secrets[0]} {planted.task}/solution/solve.sh")
    assert r.exit_code != 0 and r.stdout == ""
    assert r.stderr.count("No such file or directory") == 2, r.stderr
    # The verifier's fresh process sees the same, before and after the agent is stopped.
    r = await sandbox.exec_fresh(script, timeout=300)
    assert r.stdout == "done\n", r.stdout
    await sandbox.stop_agent()
    r = await sandbox.exec_fresh(script, timeout=300)
    assert r.stdout == "done\n", r.stdout


async def test_the_view_is_an_allow_list(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("ls -A /; echo --; ls -A /var; echo --; ls -A /opt /tmp /home /root")
    top, var, empty = r.stdout.split("--\n")
    assert set(top.split()) <= ALLOWED_TOP, set(top.split()) - ALLOWED_TOP
    assert {"usr", "etc", "tmp", "app"} <= set(top.split())
    assert var.split() == ["tmp"]
    assert empty.split() == ["/home:", "/opt:", "/root:", "/tmp:"]  # empty, the sandbox's own
    r = await sandbox.exec("ls -A /etc; echo --; cut -d: -f1 /etc/passwd /etc/group")
    etc, names = r.stdout.split("--\n")
    etc_names = set(etc.split())
    assert etc_names <= {*os.listdir("/etc"), "passwd", "group", "hosts", "hostname"}
    assert not etc_names & set(HOST_ETC), etc_names & set(HOST_ETC)
    assert sorted(names.split()) == ["nobody", "nogroup", "root", "root"]  # no host accounts


async def test_the_sandbox_tools_work(sandbox: BwrapSandbox) -> None:
    script = (
        "set -e\n"
        "echo x > /app/f && cat /app/f\n"
        "python3 -c 'import json, sqlite3, ssl; ssl.create_default_context(); print(\"python\")'\n"
        "git --version >/dev/null && echo git\n"
        "awk 'BEGIN { print \"awk\" }'\n"  # through /etc/alternatives on Debian
        "perl -e 'print \"perl\\n\"'\n"
        'echo \'{"a": "jq"}\' | jq -r .a\n'
        "sqlite3 :memory: \"select 'sqlite3'\"\n"
        "id -un\n"
        "getent hosts localhost >/dev/null && echo localhost\n"
        "hostname\n"
    )
    expected = "x\npython\ngit\nawk\nperl\njq\nsqlite3\nroot\nlocalhost\nclotho\n"
    r = await sandbox.exec(script, timeout=120)
    assert (r.exit_code, r.stdout) == (0, expected), r.stderr
    await sandbox.stop_agent()
    r = await sandbox.exec_fresh(script.replace("echo x > /app/f && ", ""), timeout=120)
    assert (r.exit_code, r.stdout) == (0, expected), r.stderr


async def test_the_harness_entries_at_root_and_etc_cannot_be_replaced(
    sandbox: BwrapSandbox, root_mode: str
) -> None:
    # One Python process (loaded before it starts): a replaced /lib64 would hand every
    # program the verifier runs a loader of the agent's, an /etc/ld.so.preload a library.
    attack = """python3 - <<'EOF'
import json, os
done = []
for name in sorted(os.listdir("/")):
    path = "/" + name
    for what, act in (("renamed", lambda: os.rename(path, path + ".old")),
                      ("removed", lambda: os.unlink(path) if os.path.islink(path) else os.rmdir(path))):
        try:
            act()
            done.append(f"{what} {path}")
        except OSError:
            pass
for path in ("/etc/ld.so.preload", "/etc/passwd", "/usr/bin/clotho-probe"):
    try:
        with open(path, "w") as f:
            f.write("/tmp/evil.so\\n")
        done.append(f"wrote {path}")
    except OSError:
        pass
print(json.dumps(sorted(os.listdir("/"))))
for line in done:
    print(line)
EOF"""
    before = await sandbox.exec("ls -A /")
    r = await sandbox.exec(attack, timeout=60)
    assert r.exit_code == 0, r.stderr
    listing, *done = r.stdout.splitlines()
    assert done == [] and sorted(before.stdout.split()) == json.loads(listing)
    links = [n for n in ("bin", "sbin", "lib", "lib64") if os.path.islink(f"/{n}")]
    assert links, "this host has no top-level links to check"
    got = await sandbox.digests([f"/{n}" for n in links])
    assert got == {f"/{n}": f"link:{os.readlink(f'/{n}')}" for n in links}
    r = await sandbox.exec("mkdir /mine && echo made")
    # overlay: `/` is sticky and open, the sandbox adds its own entries; ro: read-only
    assert r.stdout == ("made\n" if root_mode == "overlay" else ""), r.stderr


async def test_a_closed_folder_in_a_visible_tree_stays_closed(
    root_mode: str, tmp_path: Path
) -> None:
    # /usr/local is the host's (and, as root, an overlay whose folders the sandbox owns so it
    # can install there): a folder the host closed must not become the sandbox's through it.
    token = secrets.token_hex(8)
    closed = Path("/usr/local") / f"clotho-test-{token}"
    (closed / "tests").mkdir(parents=True)
    (closed / "tests" / "check.py").write_text(f"SECRET = {token!r}\n")
    closed.chmod(0o700)
    try:
        config = LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path))
        async with await open_sandbox(config) as sb:  # started after the folder was made
            r = await sb.exec(f"ls {closed}; cat {closed}/tests/check.py")
            assert r.stdout == "" and r.stderr.count("Permission denied") == 2, r.stderr
            r = await sb.exec(f"echo y > /usr/local/bin/y-{token} && cat /usr/local/bin/y-{token}")
            assert r.stdout == ("y\n" if root_mode == "overlay" else ""), r.stderr
        assert not Path(f"/usr/local/bin/y-{token}").exists()
    finally:
        shutil.rmtree(closed)


@pytest.mark.parametrize("root", ROOT_MODES)
def test_a_model_that_runs_the_reference_solution_scores_zero(planted: Planted, root: str) -> None:
    tasks = planted.task.parent
    paths = " ".join(
        shlex.quote(str(p))
        for p in (planted.task / "solution" / "solve.sh", EXAMPLES / TASK / "solution" / "solve.sh")
    )
    look = (
        "find / -name solve.sh 2>/dev/null; echo found=$(find / -name solve.sh 2>/dev/null | wc -l)"
    )
    run = f'for f in $(find / -name solve.sh 2>/dev/null) {paths}; do bash "$f"; done; echo ran'
    script = [
        assistant("", [tool_call("terminal", {"command": look})]),
        assistant("", [tool_call("terminal", {"command": run})]),
        assistant("Done."),
    ]
    out = planted.run / root  # a run folder outside /tmp, readable by anyone
    with ScriptedOpenAIServer(script) as server:
        proc = clotho(
            "eval", str(tasks), "--agent", "llm", "--model", "m", "--base-url", server.base_url,
            "--api-key-env", "SCRIPTED_KEY", "--out", str(out), "--set", f"sandbox.root={root}",
            env={"SCRIPTED_KEY": "k"}, timeout=600,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = results(out)
    assert row["error"] is None and row["reward"] == 0.0 and row["passed"] is False, row
    # The model's commands ran, and found nothing to run.
    found = json.loads(server.messages(1)[-1]["content"])["output"]
    assert found == "found=0\n", found
    ran = json.loads(server.messages(2)[-1]["content"])["output"]
    assert ran.count("No such file or directory") == 2 and ran.endswith("ran\n"), ran


def test_the_planted_task_is_solved_by_its_solution(planted: Planted) -> None:
    """The control: the same task, its solve.sh run by the oracle, scores 1."""
    out = planted.run / "oracle"
    proc = clotho("eval", str(planted.task.parent), "--agent", "oracle", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    (row,) = results(out)
    assert row["reward"] == 1.0 and row["passed"] is True, row
