"""Terminal-Bench / Harbor task fields honoured: `[environment] gpus` refused before any
sandbox starts, `allow_internet` giving that task alone a (guarded) network, and a missing
prebuilt image a `task` error that says how to get it. Real bubblewrap sandboxes, the real
Docker daemon, real HTTP on the host."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.docker_probe import requires_docker
from tests.test_eval_cli import clotho, results

from clotho.errors import SandboxError, TaskError
from clotho.sandbox import (
    DockerSandboxConfig,
    EnvironmentSpec,
    LocalSandboxConfig,
    UnsafeLocalSandboxConfig,
)
from clotho.sandbox.backends import with_task_network
from clotho.sandbox.remote_config import RaySandboxConfig
from clotho.tasks.environment import environment_spec
from clotho.tasks.harbor import load_task

# A solution that records the sandbox's network interfaces, and whether the host's own
# services answer (slirp4netns' gateway 10.0.2.2 is the host's loopback; HOST_IP one of its
# addresses): the tests read both.
PROBE = """\
tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' > /app/interfaces.txt
for target in 10.0.2.2 {host_ip}; do
  if timeout 10 bash -c "exec 3<>/dev/tcp/$target/{port}" 2>/dev/null; then
    echo "reached $target" >> /app/host.txt
  else
    echo "refused $target" >> /app/host.txt
  fi
done
"""
# The guard needs root (the sandbox's own gid); without root a networked sandbox is refused.
requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="the network guard needs root")

# reward 1: the sandbox has a network interface beside lo.
HAS_NETWORK = """\
mkdir -p /logs/verifier
if grep -qv '^lo$' /app/interfaces.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


# -- gpus -----------------------------------------------------------------------------------


def test_a_gpu_task_is_refused_naming_the_field(make_task) -> None:
    task = load_task(
        make_task("cuda", toml_extra='[environment]\ngpus = 2\ngpu_types = ["H100", "A100"]\n')
    )
    with pytest.raises(TaskError) as info:
        environment_spec(task)
    message = str(info.value)
    assert "task.toml" in message and "[environment] gpus = 2" in message
    assert "gpu_types = ['H100', 'A100']" in message and "--skip-tasks cuda" in message
    # gpus = 0 (the default) asks for nothing.
    environment_spec(load_task(make_task("cpu", toml_extra="[environment]\ngpus = 0\n")))


@requires_bwrap
def test_eval_refuses_a_gpu_task_before_its_sandbox_starts(make_task, tmp_path: Path) -> None:
    make_task("cuda", toml_extra="[environment]\ngpus = 1\n")
    make_task("plain")
    out = tmp_path / "run"
    proc = clotho("eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = {r["task"]: r for r in results(out)}
    assert rows["plain"]["passed"] is True
    cuda = rows["cuda"]
    assert cuda["error"]["kind"] == "task" and cuda["lost_tries"] == []  # not retried
    # Refused while its environment was prepared: no sandbox was acquired for it.
    assert cuda["error"]["message"].startswith("environment: ")
    assert "[environment] gpus = 1" in cuda["error"]["message"]
    assert cuda["timings"]["acquire_s"] == 0.0 and cuda["turns"] == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["errors"] == {"task": 1} and metrics["n_scored"] == 1


# -- allow_internet: the config each task gets ---------------------------------------------


def spec(network: bool | None) -> EnvironmentSpec:
    return EnvironmentSpec(name="t", network=network)


def test_a_task_network_only_where_the_task_asks_and_the_run_gives() -> None:
    local, networked = LocalSandboxConfig(), LocalSandboxConfig(network=True)
    # The run gives networks: the task that asks keeps it, the one that does not loses it.
    assert with_task_network(networked, spec(True)).network is True
    assert with_task_network(networked, spec(False)).network is False
    assert networked.network is True  # the run's own config is not changed
    # A task with no say (another format) gets the run's setting.
    assert with_task_network(networked, spec(None)).network is True
    assert with_task_network(local, spec(None)).network is False
    assert with_task_network(local, spec(False)).network is False
    # A task that asks in a run that gives none is refused, saying how to give one.
    with pytest.raises(TaskError, match=r"t: the task asks for a network .*--network"):
        with_task_network(local, spec(True))


def test_docker_gives_a_task_a_network_only_with_host_network_accepted() -> None:
    with pytest.raises(TaskError, match=r"sandbox\.host_network=true") as info:
        with_task_network(DockerSandboxConfig(), spec(True))
    assert "allow_internet" in str(info.value)
    accepted = DockerSandboxConfig(network=True, host_network=True)
    assert with_task_network(accepted, spec(True)).network is True
    offline = with_task_network(accepted, spec(False))
    assert offline.network is False and offline.host_network is True


def test_a_cluster_applies_the_tasks_say_to_what_its_nodes_run() -> None:
    ray = RaySandboxConfig(inner=LocalSandboxConfig(network=True))
    assert with_task_network(ray, spec(False)).inner.network is False  # type: ignore[union-attr]
    with pytest.raises(TaskError, match="--network"):
        with_task_network(RaySandboxConfig(inner=LocalSandboxConfig()), spec(True))
    unsafe = UnsafeLocalSandboxConfig()
    assert with_task_network(unsafe, spec(True)) is unsafe  # the host's network, unisolated


def test_the_harbor_spec_carries_allow_internet(make_task) -> None:
    asks = load_task(make_task("asks", toml_extra="[environment]\nallow_internet = true\n"))
    assert environment_spec(asks).network is True
    assert environment_spec(load_task(make_task("silent"))).network is False


# -- allow_internet: eval end to end ---------------------------------------------------------


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"host service\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def host_service() -> Iterator[tuple[str, int]]:
    """An HTTP service on every address of the host, as a trajectory API might listen."""
    server = ThreadingHTTPServer(("0.0.0.0", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: picks the outgoing address
        host_ip = probe.getsockname()[0]
    try:
        yield host_ip, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def network_tasks(make_task, host_ip: str, port: int) -> None:
    probe = PROBE.format(host_ip=host_ip, port=port)
    toml = "[environment]\nallow_internet = true\n"
    make_task("asks", solve_sh=probe, test_sh=HAS_NETWORK, toml_extra=toml)
    make_task("silent", solve_sh=probe, test_sh=HAS_NETWORK)
    make_task(
        "refuses", solve_sh=probe, test_sh=HAS_NETWORK, toml_extra=toml.replace("true", "false")
    )


@requires_bwrap
@requires_root
def test_allow_internet_opens_a_guarded_network_for_that_task_alone(
    make_task, tmp_path: Path, host_service: tuple[str, int]
) -> None:
    host_ip, port = host_service
    network_tasks(make_task, host_ip, port)
    out = tmp_path / "run"
    proc = clotho(
        "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--network", "--out", str(out),
        "--set", f"sandbox.state_dir={tmp_path / 'state'}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = {r["task"]: r for r in results(out)}
    assert all(r["error"] is None for r in rows.values()), rows
    # The task that asks has a network; the others (silent, or saying no) have none.
    assert rows["asks"]["reward"] == 1.0
    assert rows["silent"]["reward"] == 0.0 and rows["refuses"]["reward"] == 0.0


@requires_bwrap
@requires_root
def test_the_networked_task_does_not_reach_the_hosts_services(
    make_task, tmp_path: Path, host_service: tuple[str, int]
) -> None:
    """The guard holds for a task's network: its solution's own probe of the host service
    (through slirp's gateway and the host's address) is refused, while the host itself
    reaches the service."""
    host_ip, port = host_service
    probe = PROBE.format(host_ip=host_ip, port=port)
    # Control: the same probe run on the host reaches the service, so a refusal in the
    # sandbox is the guard's, not the probe's.
    control = tmp_path / "control"
    control.mkdir()
    subprocess.run(["bash", "-c", probe.replace("/app/", f"{control}/")], check=True, timeout=60)
    assert f"reached {host_ip}" in (control / "host.txt").read_text()
    check = (
        HAS_NETWORK.replace("> /logs/verifier/reward.txt", "> /logs/verifier/net.txt")
        + "if grep -q reached /app/host.txt; then echo 0; else cat /logs/verifier/net.txt; fi"
        " > /logs/verifier/reward.txt\n"
    )
    make_task(
        "asks", solve_sh=probe, test_sh=check, toml_extra="[environment]\nallow_internet = true\n"
    )
    out = tmp_path / "run"
    proc = clotho(
        "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--network", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = results(out)
    assert row["error"] is None and row["reward"] == 1.0, row


@requires_bwrap
def test_a_task_asking_for_the_internet_is_refused_by_a_run_without_network(
    make_task, tmp_path: Path
) -> None:
    network_tasks(make_task, "127.0.0.1", 9)
    out = tmp_path / "run"
    proc = clotho("eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = {r["task"]: r for r in results(out)}
    asks = rows["asks"]
    assert asks["error"]["kind"] == "task" and asks["lost_tries"] == []
    assert "allow_internet = true" in asks["error"]["message"]
    assert "--network" in asks["error"]["message"] and asks["timings"]["acquire_s"] == 0.0
    # The others run, offline, as before.
    assert rows["silent"]["error"] is None and rows["silent"]["reward"] == 0.0
    assert rows["refuses"]["error"] is None and rows["refuses"]["reward"] == 0.0


@requires_docker
def test_docker_refuses_a_task_asking_for_the_internet_without_host_network(
    make_task, tmp_path: Path
) -> None:
    make_task("asks", toml_extra="[environment]\nallow_internet = true\n")
    out = tmp_path / "run"
    proc = clotho(
        "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--sandbox", "docker",
        "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = results(out)
    assert row["error"]["kind"] == "task" and row["lost_tries"] == []
    assert "sandbox.host_network=true" in row["error"]["message"]
    assert row["timings"]["acquire_s"] == 0.0


# -- a missing prebuilt image ---------------------------------------------------------------

# A registry nobody serves: a pull fails at once, and nothing leaves this machine.
MISSING = "127.0.0.1:1/clotho-test/missing-image:1"


def test_the_harbor_spec_says_how_to_build_its_image(make_task) -> None:
    task = load_task(
        make_task("prebuilt", toml_extra=f'[environment]\ndocker_image = "{MISSING}"\n')
    )
    hint = environment_spec(task).build_hint or ""
    assert f"docker build -t {MISSING}" in hint and "task.toml" in hint and "docker_image" in hint
    assert environment_spec(load_task(make_task("plain"))).build_hint is None


def run_docker(coro_factory) -> object:
    import aiodocker

    async def main() -> object:
        docker = aiodocker.Docker()
        try:
            return await coro_factory(docker)
        finally:
            await docker.close()

    return asyncio.run(main())


@requires_docker
def test_a_missing_image_is_a_task_error_naming_it_and_how_to_build_it() -> None:
    from clotho.sandbox.docker.images import ensure_image

    with pytest.raises(TaskError) as info:
        run_docker(lambda d: ensure_image(d, MISSING, what="prebuilt", hint="build it so"))
    message = str(info.value)
    assert message.startswith(f"prebuilt: image {MISSING} is not on this machine")
    assert "cannot be pulled" in message and message.endswith("build it so")


@requires_docker
def test_a_present_image_is_used_as_it_is(tmp_path: Path) -> None:
    from clotho.sandbox.docker.images import ensure_context_image, ensure_image, image_exists

    (tmp_path / "Dockerfile").write_text("FROM scratch\nLABEL clotho.test=task-fields\n")

    async def check(docker: object) -> bool:
        tag = await ensure_context_image(docker, tmp_path, "task-fields-present")
        await ensure_image(docker, tag, what="t", hint="never said")
        return await image_exists(docker, tag)

    assert run_docker(check) is True


def test_an_unreachable_daemon_is_infrastructure_not_the_task() -> None:
    import aiodocker

    from clotho.sandbox.docker.images import ensure_image

    async def main() -> None:
        docker = aiodocker.Docker(url="unix:///nonexistent/docker.sock")
        try:
            await ensure_image(docker, MISSING, what="t")
        finally:
            await docker.close()

    with pytest.raises(SandboxError, match="cannot be reached"):
        asyncio.run(main())
