"""The backend contract (sandbox/backends.py) with real backends: `SlotPool.prepare` on
bubblewrap and Docker, image facts keyed by image ID, exit cleanup on a configured
`docker_url`, lone sandboxes that close their own backend.

The Docker tests are skipped with the reason shown when no Docker daemon answers; in CI
(CI=true) its absence fails them instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import DOCKER_PROBLEM, IN_CI, requires_docker  # noqa: F401

from clotho.errors import SandboxError, TaskError
from clotho.sandbox import (
    DockerSandboxConfig,
    EnvironmentSpec,
    LocalSandboxConfig,
    PoolConfig,
    PreparedEnvironment,
    SlotPool,
    UnsafeLocalSandboxConfig,
    open_sandbox,
)
from clotho.sandbox.backends import LocalBackend, backend_key, make_backend
from clotho.sandbox.docker import images
from clotho.sandbox.docker.images import context_hash
from clotho.sandbox.leases import OWNER
from clotho.sandbox.state import LEASE_FILE, STATE_PREFIX, make_state_dir

BASE_IMAGE = "clotho/base:bookworm"

requires_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None,
    reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap",
)


@pytest.fixture
async def tags(docker: Any) -> AsyncIterator[list[str]]:
    """Image tags a test makes; removed afterwards."""
    from aiodocker.exceptions import DockerError

    created: list[str] = []
    yield created
    for tag in created:
        try:
            await docker.images.delete(tag, force=True)
        except DockerError as exc:
            assert exc.status == 404, exc


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tags actually built (not found ready) while the test runs."""
    built: list[str] = []
    real_build = images.build_image

    async def counting_build(docker: Any, context: Path, tag: str, **kwargs: Any) -> str:
        built.append(tag)
        return await real_build(docker, context, tag, **kwargs)

    monkeypatch.setattr(images, "build_image", counting_build)
    return built


def write_context(root: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "Dockerfile").write_text(dockerfile)
    for rel, content in (files or {}).items():
        (root / rel).write_text(content)
    return root


# --- local backends: nothing to prepare -------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "limited"),
    [
        (LocalSandboxConfig(), LocalSandboxConfig(cpus=2, memory_mb=64)),
        (UnsafeLocalSandboxConfig(), UnsafeLocalSandboxConfig()),  # nothing to limit with
    ],
)
async def test_local_backends_build_nothing_and_take_the_tasks_limits(
    base: Any, limited: Any, tmp_path: Path
) -> None:
    context = write_context(tmp_path / "env", "FROM scratch\n")
    spec = EnvironmentSpec(name="t", context=context, image="some/image:1", cpus=2, memory_mb=64)
    async with SlotPool(PoolConfig()) as pool:
        prepared = await pool.prepare(base, spec, force_build=True)
    assert prepared == PreparedEnvironment(config=limited, workspace_in_image=False)
    with pytest.raises(SandboxError, match="closed"):
        await pool.prepare(base, spec)


def test_backends_are_kept_per_kind_and_place() -> None:
    local, elsewhere = LocalSandboxConfig(), LocalSandboxConfig(state_dir="/tmp/other")
    assert backend_key(local) != backend_key(elsewhere)
    assert backend_key(local) != backend_key(UnsafeLocalSandboxConfig())
    docker = DockerSandboxConfig()
    assert backend_key(docker, docker_url="unix:///a") != backend_key(docker)
    named = DockerSandboxConfig(docker_url="unix:///b")
    assert backend_key(named, docker_url="unix:///a") == backend_key(named)
    assert isinstance(make_backend(local), LocalBackend)


@requires_bwrap
async def test_lone_local_sandbox_leaves_nothing(tmp_path: Path) -> None:
    config = LocalSandboxConfig(state_dir=str(tmp_path))
    async with await open_sandbox(config, {"k": "v"}) as sb:
        assert (await sb.exec("echo hi")).stdout == "hi\n"
        assert [r.labels["k"] for r in await LocalBackend(str(tmp_path)).records()] == ["v"]
    assert list(tmp_path.iterdir()) == []


@requires_bwrap
async def test_pool_reaps_orphans_where_a_backend_is_first_used(tmp_path: Path) -> None:
    """A config with its own state folder gets its own backend; making it reaps the dead
    runs' folders there (not only in TMPDIR), and leaves live ones alone."""
    state = tmp_path / "state"
    dead = f"{socket.gethostname()}:{dead_pid()}"
    orphan = make_state_dir(str(state), {OWNER: dead, "probe": "orphan"})
    live = make_state_dir(str(state), {"probe": "live"})
    async with SlotPool(PoolConfig()) as pool:
        assert orphan.exists()  # nothing there is known before the backend is used
        async with pool.lease(LocalSandboxConfig(state_dir=str(state))) as sb:
            assert (await sb.exec("echo in")).stdout == "in\n"
            for _ in range(100):
                if not orphan.exists():
                    break
                await asyncio.sleep(0.05)
            assert not orphan.exists()
            assert live.exists()


# --- docker: images -----------------------------------------------------------------------


@requires_docker
async def test_docker_prepare_builds_once_applies_limits_and_keeps_the_workspace(
    docker: Any, tags: list[str], builds: list[str], tmp_path: Path
) -> None:
    token = secrets.token_hex(4)
    context = write_context(
        tmp_path / "env",
        f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY data.txt /app/\n",
        {"data.txt": f"payload {token}\n"},
    )
    tag = f"clotho-env/prep-{token}:{context_hash(context)[:16]}"
    tags.append(tag)
    spec = EnvironmentSpec(name=f"prep-{token}", context=context, cpus=1.5, memory_mb=300)
    base = DockerSandboxConfig(pids_limit=128)
    async with SlotPool(PoolConfig()) as pool:
        first = await asyncio.gather(*(pool.prepare(base, spec) for _ in range(3)))
        assert builds == [tag]  # concurrent attempts share one build
        again = await pool.prepare(base, spec)
        assert builds == [tag]  # cached by content
        for prepared in [*first, again]:
            assert prepared.workspace_in_image
            assert prepared.config == base.model_copy(
                update={"image": tag, "cpus": 1.5, "memory_mb": 300}
            )
        # The base config's own limits win over the task's.
        own = await pool.prepare(base.model_copy(update={"cpus": 0.5}), spec)
        assert (own.config.cpus, own.config.memory_mb) == (0.5, 300)

        sandbox = await pool.acquire(again.config)
        try:
            assert (await sandbox.exec("cat data.txt")).stdout == f"payload {token}\n"
            host = (await docker.containers.container(sandbox.id).show())["HostConfig"]
            assert (host["NanoCpus"], host["Memory"]) == (1_500_000_000, 300 << 20)
        finally:
            await pool.release(sandbox)

        # force_build rebuilds once per pool, not once per attempt.
        forced = await asyncio.gather(
            *(pool.prepare(base, spec, force_build=True) for _ in range(2))
        )
        assert builds == [tag, tag]
        assert {p.config.image for p in forced} == {tag}
        await pool.prepare(base, spec, force_build=True)
        assert builds == [tag, tag]


@requires_docker
async def test_docker_prepare_prebuilt_base_and_missing_images(
    tags: list[str], builds: list[str], tmp_path: Path
) -> None:
    token = secrets.token_hex(4)
    base = DockerSandboxConfig()
    async with SlotPool(PoolConfig()) as pool:
        # Neither an image nor a Dockerfile: the base image, workspace uploaded.
        plain = await pool.prepare(base, EnvironmentSpec(name="plain"))
        assert plain == PreparedEnvironment(config=base, workspace_in_image=False)
        # A prebuilt image present here is used as it is.
        prebuilt = await pool.prepare(base, EnvironmentSpec(name="pre", image=BASE_IMAGE))
        assert (prebuilt.config.image, prebuilt.workspace_in_image) == (BASE_IMAGE, False)
        # Absent, with nothing to build it from: an error that names it.
        missing = f"clotho-test/absent:{token}"
        with pytest.raises(SandboxError, match=missing):
            await pool.prepare(base, EnvironmentSpec(name="gone", image=missing))
        # Absent, with a Dockerfile: built.
        context = write_context(tmp_path / "env", f"FROM {BASE_IMAGE}\nRUN echo {token}\n")
        tag = f"clotho-env/fallback-{token}:{context_hash(context)[:16]}"
        tags.append(tag)
        spec = EnvironmentSpec(name=f"fallback-{token}", context=context, image=missing)
        built = await pool.prepare(base, spec)
        assert (built.config.image, built.workspace_in_image, builds) == (tag, True, [tag])
    assert builds == [tag]


@requires_docker
async def test_a_broken_dockerfile_is_a_task_error_built_once(
    builds: list[str], tmp_path: Path
) -> None:
    token = secrets.token_hex(4)
    context = write_context(
        tmp_path / "env", f"FROM {BASE_IMAGE}\nRUN echo broken-{token}; exit 7\n"
    )
    spec = EnvironmentSpec(name=f"broken-{token}", context=context)
    async with SlotPool(PoolConfig()) as pool:
        with pytest.raises(TaskError, match=f"broken-{token}") as info:
            await pool.prepare(DockerSandboxConfig(), spec)
        assert not isinstance(info.value, SandboxError)
        assert len(builds) == 1
        with pytest.raises(TaskError, match="non-zero code: 7"):  # remembered, not rebuilt
            await pool.prepare(DockerSandboxConfig(), spec)
        assert len(builds) == 1


@requires_docker
async def test_an_unreachable_daemon_is_a_sandbox_error(tmp_path: Path) -> None:
    context = write_context(tmp_path / "env", f"FROM {BASE_IMAGE}\n")
    url = f"unix://{tmp_path}/no-daemon.sock"
    async with SlotPool(PoolConfig(), docker_url=url) as pool:
        with pytest.raises(SandboxError, match="cannot be reached"):
            await pool.prepare(DockerSandboxConfig(), EnvironmentSpec(name="t", context=context))


@requires_docker
async def test_entrypoint_answer_follows_the_image_id_not_the_tag(
    docker: Any, tags: list[str], tmp_path: Path
) -> None:
    """One backend, one tag rebuilt with an ENTRYPOINT: the new image's answer is used (its
    container runs `sleep infinity` through the entrypoint), not the one cached for the tag."""
    tag = f"clotho-test/retag:{secrets.token_hex(4)}"
    tags.append(tag)
    plain = write_context(tmp_path / "plain", f"FROM {BASE_IMAGE}\n")
    wrapped = write_context(
        tmp_path / "wrapped",
        f"FROM {BASE_IMAGE}\n"
        'ENTRYPOINT ["/bin/sh", "-c", "echo entry > /tmp/entry-ran; exec \\"$@\\"", "--"]\n',
    )
    config = DockerSandboxConfig(image=tag)
    async with SlotPool(PoolConfig()) as pool:
        for context, cmd, ran in [
            (plain, "sh", "no\n"),
            (wrapped, "sleep", "entry\n"),
            (plain, "sh", "no\n"),
        ]:
            await images.build_image(docker, context, tag)
            sandbox = await pool.acquire(config)
            try:
                info = await docker.containers.container(sandbox.id).show()
                assert info["Config"]["Cmd"][0] == cmd
                assert (await sandbox.exec("cat /tmp/entry-ran || echo no")).stdout == ran
            finally:
                await pool.release(sandbox)


# --- docker: lifetimes ----------------------------------------------------------------------


@requires_docker
@pytest.mark.parametrize("slots", [1, 2])
async def test_lone_docker_sandbox_closes_its_backend(docker: Any, slots: int) -> None:
    from aiodocker.exceptions import DockerError

    marker = f"lone-{secrets.token_hex(4)}"
    config = DockerSandboxConfig(slots_per_container=slots, slot_isolation="none")
    sb: Any = await open_sandbox(config, {"probe": marker})
    client = sb._docker
    container_id = sb.container.id
    async with sb:
        assert (await sb.exec("echo hi")).stdout == "hi\n"
        assert not client.session.closed
    assert client.session.closed  # the lone backend's client went with it
    with pytest.raises(DockerError) as info:
        await docker.containers.container(container_id).show()
    assert info.value.status == 404
    await sb.close()  # still idempotent


@requires_docker
async def test_pool_close_closes_its_backends(docker: Any) -> None:
    pool = SlotPool(PoolConfig())
    async with pool:
        sandbox: Any = await pool.acquire(DockerSandboxConfig())
        client = sandbox._docker
        await pool.release(sandbox)
    assert client.session.closed
    with pytest.raises(SandboxError, match="closed"):
        await pool.acquire(DockerSandboxConfig())


EXITS_WITHOUT_CLOSING = """
import asyncio, sys
from clotho.sandbox import open_sandbox
from clotho.sandbox.config import DockerSandboxConfig

async def main():
    config = DockerSandboxConfig(docker_url=sys.argv[2], slots_per_container=int(sys.argv[3]))
    sb = await open_sandbox(config, labels={"probe": sys.argv[1]})
    print(sb.container.id, flush=True)

asyncio.run(main())
"""


@requires_docker
@pytest.mark.parametrize("slots", [1, 2])
async def test_exit_cleanup_uses_the_configured_docker_url(
    docker: Any, tmp_path: Path, slots: int
) -> None:
    """The daemon reached through another socket path (DOCKER_HOST points nowhere): the
    atexit hook still removes the container, on the address the client really used."""
    from aiodocker.exceptions import DockerError

    socket_path = next(p for p in ("/var/run/docker.sock", "/run/docker.sock") if os.path.exists(p))
    link = tmp_path / "other-docker.sock"
    link.symlink_to(socket_path)
    marker = f"exit-url-{secrets.token_hex(4)}"
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/nothing-here.sock"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", EXITS_WITHOUT_CLOSING, marker, f"unix://{link}", str(slots),
        stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    stdout, _ = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0
    container_id = stdout.decode().strip()
    assert len(container_id) == 64  # it was created ...
    with pytest.raises(DockerError) as info:  # ... and the atexit hook removed it
        await docker.containers.container(container_id).show()
    assert info.value.status == 404
    assert await docker.containers.list(all=True, filters={"label": [f"probe={marker}"]}) == []


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@requires_docker
@requires_bwrap
async def test_sandbox_gc_goes_through_the_backends_at_their_addresses(
    docker: Any, tmp_path: Path
) -> None:
    """`clotho sandbox gc --docker-url --state-dir`: orphaned containers on that daemon and
    orphaned folders in that state folder go; live ones stay. DOCKER_HOST points nowhere."""
    from aiodocker.exceptions import DockerError

    socket_path = next(p for p in ("/var/run/docker.sock", "/run/docker.sock") if os.path.exists(p))
    link = tmp_path / "gc-docker.sock"
    link.symlink_to(socket_path)
    state = tmp_path / "state"
    marker = f"gc-{secrets.token_hex(4)}"
    dead = f"{socket.gethostname()}:{dead_pid()}"
    orphan = await docker.containers.create(
        {
            "Image": BASE_IMAGE,
            "Cmd": ["sleep", "infinity"],
            "Labels": {"clotho": "1", OWNER: dead, "probe": marker},
            "HostConfig": {"NetworkMode": "none"},
        }
    )
    # A folder whose owner died: what a SIGKILLed run leaves.
    local = await open_sandbox(LocalSandboxConfig(state_dir=str(state)), {"probe": marker})
    (lease_file,) = state.glob(f"{STATE_PREFIX}*/{LEASE_FILE}")
    folder = lease_file.parent
    lease = json.loads(lease_file.read_text())
    await local.close()
    folder.mkdir()
    lease_file.write_text(json.dumps({**lease, "labels": {**lease["labels"], OWNER: dead}}))
    live = await open_sandbox(
        DockerSandboxConfig(docker_url=f"unix://{link}", state_dir=str(state)), {"probe": marker}
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clotho", "sandbox", "gc",
            "--docker-url", f"unix://{link}", "--state-dir", str(state),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/nothing.sock"},
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, stderr.decode()
        assert "not checked" not in stdout.decode(), stdout.decode()
        with pytest.raises(DockerError) as info:
            await orphan.show()
        assert info.value.status == 404
        assert not folder.exists()
        assert (await live.exec("echo alive")).stdout == "alive\n"  # owner alive: kept
    finally:
        await live.close()
        with contextlib.suppress(DockerError):
            await orphan.delete(force=True)
