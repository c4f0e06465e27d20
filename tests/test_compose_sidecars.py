"""Multi-container tasks: a compose file's other services run beside the Docker sandbox.

The task's tests need its sidecar (a tiny HTTP key-value service built from its own small
Dockerfile on the base image the other Docker tests use): the oracle scores 1, `nop` 0, and
nothing of the run is left afterwards. A leftover sidecar (its owner killed) is found and
removed by `clotho sandbox gc`. What compose asks that clotho cannot give is refused as the
task's error, and so is a task with sidecars on a backend that cannot run them.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.docker_probe import DOCKER_PROBLEM, requires_docker
from tests.support import run_clotho, wait_until, wait_until_sync

from clotho.errors import TaskError
from clotho.sandbox import DockerSandboxConfig, LocalSandboxConfig
from clotho.sandbox.backends import EnvironmentSpec, check_sidecars
from clotho.tasks.compose import sidecar_specs
from clotho.tasks.environment import environment_spec
from clotho.tasks.harbor import load_task

KV_SERVER = """\
import http.server, os, sys

store = dict(arg.split("=", 1) for arg in sys.argv[1:])  # the compose `command` seeds it


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        key = self.path.strip("/")
        if key not in store:
            self.send_response(404)
            self.end_headers()
            return
        body = store[key].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        length = int(self.headers.get("Content-Length") or 0)
        store[self.path.strip("/")] = self.rfile.read(length).decode()
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["KV_PORT"])), Handler).serve_forever()
"""

COMPOSE = """\
services:
  main:
    depends_on:
      kv:
        condition: service_healthy
  kv:
    build: ./kv
    command: ["python3", "/kv.py", "greeting=${GREETING:-hello}"]
    environment:
      KV_PORT: "8765"
    mem_limit: 256m
    healthcheck:
      test: ["CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/greeting')"]
      interval: 1s
      timeout: 5s
      retries: 60
"""

SOLVE = """\
python3 - <<'EOF'
import urllib.request
value = urllib.request.urlopen("http://kv:8765/greeting").read()
urllib.request.urlopen(urllib.request.Request("http://kv:8765/answer", data=value, method="PUT"))
EOF
"""

TEST = """\
mkdir -p /logs/verifier
got=$(python3 -c "import urllib.request; print(urllib.request.urlopen('http://kv:8765/answer').read().decode())" 2>/dev/null)
if [ "$got" = hello ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def kv_task(make_task, name: str = "kv-task", compose: str = COMPOSE) -> Path:
    return make_task(
        name,
        instruction="Read key greeting from the key-value service at http://kv:8765 and "
        "store its value under key answer (HTTP PUT).",
        solve_sh=SOLVE,
        test_sh=TEST,
        env_files={
            "Dockerfile": "FROM clotho/base:bookworm\nWORKDIR /app\n",
            "docker-compose.yaml": compose,
            "kv/Dockerfile": "FROM clotho/base:bookworm\nCOPY kv.py /kv.py\n",
            "kv/kv.py": KV_SERVER,
        },
    )


# -- reading the compose file (no Docker) -----------------------------------------------


def test_sidecars_are_read_with_command_environment_and_health(make_task) -> None:
    task = load_task(kv_task(make_task))
    (kv,) = sidecar_specs(task)
    assert kv.name == "kv" and kv.context is not None and kv.context.name == "kv"
    assert kv.command == ["python3", "/kv.py", "greeting=hello"]  # ${VAR:-default}
    assert kv.env == {"KV_PORT": "8765"} and kv.memory_mb == 256
    assert kv.healthcheck is not None and kv.healthcheck.interval_s == 1.0
    assert kv.healthcheck.retries == 60
    assert environment_spec(task).sidecars == [kv]


def test_dependencies_start_first_and_dotenv_is_read(make_task) -> None:
    compose = textwrap.dedent(
        """\
        services:
          client:
            build: .
            volumes:
              - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}
          web:
            image: clotho/base:bookworm
            environment: [ "DB=db:${DB_PORT}" ]
            depends_on: {db: {condition: service_healthy}, setup: {condition: service_completed_successfully}}
          setup:
            image: clotho/base:bookworm
            command: "true"
          db:
            image: clotho/base:bookworm
            command: sleep infinity
        """
    )
    task = load_task(
        make_task(
            "ordered",
            env_files={"docker-compose.yaml": compose, ".env": "DB_PORT=5432\n", "Dockerfile": ""},
        )
    )
    specs = sidecar_specs(task)
    names = [s.name for s in specs]
    assert names.index("db") < names.index("web") and names.index("setup") < names.index("web")
    by_name = {s.name: s for s in specs}
    assert by_name["web"].env == {"DB": "db:5432"}
    assert by_name["setup"].completes and not by_name["db"].completes
    assert by_name["db"].command == ["sleep", "infinity"]


def test_the_main_service_is_built_and_never_a_sidecar(make_task) -> None:
    """One reading of which service is the sandbox: its build is the image, the others are
    sidecars; a main service without a build builds nothing (a sidecar's build is never
    taken for it)."""
    from clotho.tasks.environment import build_context

    built = "services:\n  client:\n    build: ./img\n  db:\n    image: clotho/base:bookworm\n"
    task = load_task(
        make_task("built", env_files={"docker-compose.yaml": built, "img/Dockerfile": "FROM x\n"})
    )
    found = build_context(task)
    assert found is not None and found[0].name == "img"
    assert [s.name for s in sidecar_specs(task)] == ["db"]
    overlay = "services:\n  main:\n    depends_on: [api]\n  api:\n    build: ./api\n"
    task = load_task(
        make_task(
            "overlay", env_files={"docker-compose.yaml": overlay, "api/Dockerfile": "FROM x\n"}
        )
    )
    assert build_context(task) is None
    assert [s.name for s in sidecar_specs(task)] == ["api"]


@pytest.mark.parametrize(
    ("service", "key"),
    [
        ("ports: ['8080:80']", "ports"),
        ("volumes: ['/etc:/host-etc']", "volumes"),
        ("privileged: true", "privileged"),
        ("devices: ['/dev/kvm:/dev/kvm']", "devices"),
        ("cap_add: [NET_ADMIN]", "cap_add"),
        ("network_mode: host", "network_mode"),
        ("sysctls: {net.core.somaxconn: 1024}", "sysctls"),
    ],
)
def test_what_clotho_cannot_give_a_sidecar_is_refused(make_task, service: str, key: str) -> None:
    compose = f"services:\n  db:\n    image: clotho/base:bookworm\n    {service}\n"
    task = load_task(make_task("refused", env_files={"docker-compose.yaml": compose}))
    with pytest.raises(TaskError, match=rf"services\.db\.{key}:.*refuses rather than ignores"):
        environment_spec(task)


@pytest.mark.parametrize(
    ("compose", "match"),
    [
        ("services:\n  main:\n    ports: ['80:80']\n", r"services\.main\.ports"),
        ("services:\n  main:\n    network_mode: host\n", r"services\.main\.network_mode"),
        ("services:\n  main:\n    volumes: ['/:/host']\n", r"services\.main\.volumes"),
        ("services:\n  db:\n    image: 'x:${NOPE}'\n", r"\$\{NOPE\} has no value"),
        ("services:\n  db:\n    image: x\n    environment: [HOME]\n", r"HOME.*has no value"),
        ("services:\n  db:\n    image: x\n    depends_on: [cache]\n", r"no service 'cache'"),
        ("services:\n  a:\n    image: x\n    depends_on: [b]\n  b:\n    image: x\n"
         "    depends_on: [a]\n", "a cycle"),
        ("services:\n  db:\n    image: x\nvolumes:\n  data: {}\n", r"volumes: top-level key"),
        ("services:\n  db:\n    build: ../../..\n", "leaves the task folder"),
    ],
)  # fmt: skip
def test_a_compose_file_asking_too_much_is_a_task_error(
    make_task, compose: str, match: str
) -> None:
    task = load_task(
        make_task("bad", env_files={"docker-compose.yaml": compose, "Dockerfile": "FROM x\n"})
    )
    with pytest.raises(TaskError, match=match):
        environment_spec(task)


def test_sidecars_on_a_backend_that_cannot_run_them_are_a_task_error(make_task) -> None:
    spec = environment_spec(load_task(kv_task(make_task)))
    with pytest.raises(TaskError, match=r"kv-task: .*\(kv, .*needs the docker backend"):
        check_sidecars(LocalSandboxConfig(), spec)
    check_sidecars(DockerSandboxConfig(), spec)  # Docker runs them
    check_sidecars(LocalSandboxConfig(), EnvironmentSpec(name="plain"))  # none: nothing to say


def test_local_eval_of_a_sidecar_task_is_a_task_error_not_a_run(make_task, tmp_path) -> None:
    kv_task(make_task)
    out = run_folder(tmp_path)
    proc = _clotho("eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(out))
    (record,) = _results(out)
    assert record["error"]["kind"] == "task", (record, proc.stderr)
    assert "needs the docker backend" in record["error"]["message"]


# -- running on Docker -------------------------------------------------------------------


def _clotho(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_clotho(*args, env={"COLUMNS": "300"}, timeout=timeout)


def _results(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_folder(tmp_path: Path) -> Path:
    """A run folder whose name no other run on this daemon has (containers are found by the
    run label, which starts with the folder's name: a test suite running beside this one has
    the same `tmp_path` names)."""
    return tmp_path / f"run-{secrets.token_hex(6)}"


def _run_containers(out: Path, label: str = "clotho=1") -> list[str]:
    """The run's containers (by the run label: see run_folder) that carry `label`."""
    proc = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label={label}", "--format",
         '{{.Names}} {{.Label "clotho.run"}}'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [
        line.split()[0]
        for line in proc.stdout.splitlines()
        if len(line.split()) == 2 and line.split()[1].startswith(f"{out.name}-")
    ]


@requires_docker
def test_oracle_passes_nop_fails_and_nothing_is_left(make_task, tmp_path: Path) -> None:
    if DOCKER_PROBLEM is not None:
        pytest.fail(f"CI=true runs the Docker tests, but no daemon answers: {DOCKER_PROBLEM}")
    kv_task(make_task)
    rewards = {}
    for agent in ("oracle", "nop"):
        out = tmp_path / f"run-{agent}"
        proc = _clotho(
            "eval", str(tmp_path / "tasks"), "--agent", agent, "--sandbox", "docker",
            "--out", str(out),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        (record,) = _results(out)
        assert record["error"] is None, record
        rewards[agent] = record["reward"]
        assert _run_containers(out) == [], f"{agent} left containers behind"
    assert rewards == {"oracle": 1.0, "nop": 0.0}


@requires_docker
def test_a_sidecar_that_never_gets_healthy_is_a_task_error_naming_it(
    make_task, tmp_path: Path
) -> None:
    compose = COMPOSE.replace("urlopen('http://127.0.0.1:8765/greeting')", "exit(1)").replace(
        "retries: 60", "retries: 2"
    )
    kv_task(make_task, "sick", compose)
    out = run_folder(tmp_path)
    proc = _clotho(
        "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--sandbox", "docker",
        "--out", str(out),
    )  # fmt: skip
    (record,) = _results(out)
    assert record["error"] is not None, (record, proc.stderr[-2000:])
    assert record["error"]["kind"] == "task", record
    assert "sidecar 'kv' is unhealthy" in record["error"]["message"], record
    assert _run_containers(out) == []


@requires_docker
async def test_a_sidecar_past_the_disk_limit_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the disk limit is watched (no file system of its size), a sidecar whose writable
    layer outgrows the sandbox's storage_mb is killed: what the agent makes a service store
    is bounded too. Closing the sandbox removes it."""
    from clotho.sandbox.docker.backend import DockerBackend
    from clotho.sandbox.docker.sidecars import SidecarSandbox
    from clotho.sandbox.sidecar_spec import SidecarSpec

    monkeypatch.setenv("CLOTHO_DOCKER_QUOTA", "0")
    filler = SidecarSpec(
        name="filler",
        image="clotho/base:bookworm",
        command=["sh", "-c", "head -c 40000000 /dev/zero > /big && sleep infinity"],
    )
    config = DockerSandboxConfig(storage_mb=16, storage_check_s=0.2, sidecars=[filler])
    backend = DockerBackend()
    sandbox = await backend.open(config, {"clotho.task": "disk-filler"})
    try:
        assert isinstance(sandbox, SidecarSandbox)
        assert await wait_until(lambda: sandbox.sidecar_over_disk is not None, timeout=120)
        assert sandbox.sidecar_over_disk == "filler"
        (container,) = sandbox._sidecars or []
        state = (await container.show())["State"]
        assert not state["Running"], state
        assert (await sandbox.exec("echo still here")).stdout == "still here\n"
    finally:
        await sandbox.close()
        await backend.aclose()
    assert _containers_of_task("disk-filler") == []


def _containers_of_task(task: str) -> list[str]:
    proc = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=clotho.task={task}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout.split()


def _start_run(task: Path, out: Path) -> subprocess.Popen[bytes]:
    """A run of the oracle whose solution, once it stored the answer, waits: returns when
    the agent has reached the sidecar (the sandbox and its service are up)."""
    solve = task / "solution" / "solve.sh"
    solve.write_text(f"{SOLVE}touch /app/started\nsleep 600\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "clotho", "eval", str(task), "--agent", "oracle",
         "--sandbox", "docker", "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until_sync(lambda: _agent_started(out) or proc.poll() is not None, timeout=300)
        assert proc.poll() is None, "the run ended before its agent reached the sidecar"
        assert _sidecars_of(out), "the sidecar should be running beside the sandbox"
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc


@requires_docker
def test_ctrl_c_removes_the_sidecar_with_its_sandbox(make_task, tmp_path: Path) -> None:
    out = run_folder(tmp_path)
    proc = _start_run(kv_task(make_task, "interrupted"), out)
    try:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert _run_containers(out) == [], "Ctrl-C left the run's containers"


@requires_docker
def test_the_tests_reach_the_sidecar_beside_the_agents_services(make_task, tmp_path: Path) -> None:
    """A solution that leaves a process running is judged from a verification twin (the
    agent's services keep serving): the twin sees the sidecar by its name too."""
    task = kv_task(make_task, "with-service")
    (task / "solution" / "solve.sh").write_text(f"{SOLVE}nohup sleep 600 >/dev/null 2>&1 &\n")
    out = run_folder(tmp_path)
    proc = _clotho(
        "eval", str(task), "--agent", "oracle", "--sandbox", "docker", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = _results(out)
    assert record["error"] is None and record["reward"] == 1.0, record
    assert _run_containers(out) == []


@requires_docker
def test_gc_removes_a_killed_runs_sidecar(make_task, tmp_path: Path) -> None:
    """`clotho sandbox ls` lists a sidecar beside its sandbox; a run SIGKILLed while its
    sidecar serves (no exit cleanup runs) leaves nothing once `clotho sandbox gc` ran: the
    sidecar is found by its dead owner and removed with its sandbox."""
    out = run_folder(tmp_path)
    proc = _start_run(kv_task(make_task, "left"), out)
    try:
        # Listed while its run is alive (an orphan may be reaped by any clotho process's
        # pool on this machine at any moment: that is the design).
        (sidecar,) = _sidecars_of(out)
        short_id = subprocess.run(
            ["docker", "inspect", "--format", "{{.Id}}", sidecar],
            capture_output=True, text=True, check=True,
        ).stdout.strip()[:12]  # fmt: skip
        listed = _clotho("sandbox", "ls")
        rows = [line for line in listed.stdout.splitlines() if short_id in line]
        assert rows and "docker-sidecar" in rows[0], listed.stdout
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    gc = _clotho("sandbox", "gc")
    assert gc.returncode == 0, gc.stderr
    assert _run_containers(out) == [], "gc left the run's containers"


def _sidecars_of(out: Path) -> list[str]:
    return _run_containers(out, "clotho.sidecar=kv")


def _agent_started(out: Path) -> bool:
    """The oracle's solution has stored its answer: the sandbox reached its sidecar."""
    for name in _run_containers(out):
        if name.endswith("-kv"):
            continue
        probe = subprocess.run(
            ["docker", "exec", name, "test", "-e", "/app/started"], capture_output=True
        )
        if probe.returncode == 0:
            return True
    return False
