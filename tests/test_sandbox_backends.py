"""The backend contract (sandbox/backends.py) with real backends: `SlotPool.prepare` on
bubblewrap and Docker, image facts keyed by image ID, exit cleanup on a configured
`docker_url`, lone sandboxes that close their own backend.

The Docker tests are skipped with the reason shown when no Docker daemon answers; in CI
(CI=true) its absence fails them instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import random
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import requires_docker
from tests.sandbox_fixtures import (
    BASE_IMAGE,
    GatedExecutor,
    dead_pid,
    requires_bwrap,
    write_context,
)
from tests.support import PATIENCE_S, wait_until

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
from clotho.sandbox.backends import backend_key, make_backend
from clotho.sandbox.base import Sandbox
from clotho.sandbox.docker import images
from clotho.sandbox.docker.images import context_hash
from clotho.sandbox.host.leases import LEASE_FILE, OWNER, STATE_PREFIX
from clotho.sandbox.host.state import make_state_dir
from clotho.sandbox.local.backend import LocalBackend
from clotho.sandbox.transfer import BIG_FILE

pytest_plugins = ("tests.sandbox_fixtures",)  # its fixtures

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
            assert await wait_until(lambda: not orphan.exists())
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
        # Absent, with nothing to build it from (not pullable here): the task's error, named.
        missing = f"clotho-test/absent:{token}"
        with pytest.raises(TaskError, match=missing):
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


def socket_elsewhere(tmp_path: Path) -> Path:
    """The Docker daemon's socket reached through a link at another path."""
    socket_path = next(p for p in ("/var/run/docker.sock", "/run/docker.sock") if os.path.exists(p))
    link = tmp_path / "other-docker.sock"
    link.symlink_to(socket_path)
    return link


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

    link = socket_elsewhere(tmp_path)
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


@requires_docker
@requires_bwrap
async def test_sandbox_gc_goes_through_the_backends_at_their_addresses(
    docker: Any, tmp_path: Path
) -> None:
    """`clotho sandbox gc --docker-url --state-dir`: orphaned containers on that daemon and
    orphaned folders in that state folder go; live ones stay. DOCKER_HOST points nowhere."""
    from aiodocker.exceptions import DockerError

    link = socket_elsewhere(tmp_path)
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


# --- files: one contract, every backend ---------------------------------------------------------


async def test_all_byte_values_and_odd_names_round_trip(any_sandbox: Sandbox) -> None:
    sb = any_sandbox
    data = bytes(range(256)) * 3
    await sb.write_file("bytes.bin", data)
    assert await sb.read_file("bytes.bin") == data
    assert await sb.read_file(f"{sb.workdir}/bytes.bin") == data
    r = await sb.exec("wc -c < bytes.bin; od -An -tx1 -N4 -j254 bytes.bin")
    assert r.stdout.split() == ["768", "fe", "ff", "00", "01"]
    await sb.write_file("bytes.bin", b"short")  # replaces, no leftover tail
    assert await sb.read_file("bytes.bin") == b"short"
    await sb.write_file("a/b/c.txt", b"first version, longer")  # parents made
    assert (await sb.exec("cat a/b/c.txt")).stdout == "first version, longer"
    r = await sb.exec(r"printf 'inside\000\377' > '-odd name $x'")
    assert r.exit_code == 0, r.stderr
    assert await sb.read_file("-odd name $x") == b"inside\x00\xff"
    await sb.write_file('it\'s a "quoted" name', b"")
    assert await sb.read_file(f'{sb.workdir}/it\'s a "quoted" name') == b""


async def test_large_random_file_round_trip(any_sandbox: Sandbox) -> None:
    data = random.Random(1234).randbytes(5 << 20)
    await any_sandbox.write_file("deep/er/big.bin", data)
    r = await any_sandbox.exec("sha256sum < deep/er/big.bin")
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert await any_sandbox.read_file("deep/er/big.bin") == data


async def test_upload_download_tree_and_single_files(any_sandbox: Sandbox, tmp_path: Path) -> None:
    sb = any_sandbox
    src = tmp_path / "src"
    (src / "nested" / "deeper").mkdir(parents=True)
    (src / "top.txt").write_text("top\n")
    (src / "nested" / "deeper" / "leaf.txt").write_text("leaf")
    blob = random.Random(7).randbytes(100_000)
    (src / "nested" / "blob.bin").write_bytes(blob)
    (src / "script.sh").write_text("#!/bin/sh\necho run\n")
    (src / "script.sh").chmod(0o755)
    (src / "link").symlink_to("nested/deeper/leaf.txt")

    await sb.exec("mkdir -p proj && echo keep > proj/keep.txt")
    await sb.upload(src, "proj")  # into a folder that exists: what is there stays
    r = await sb.exec(
        "cat proj/top.txt proj/nested/deeper/leaf.txt; echo; readlink proj/link; "
        "cat proj/link; echo; ./proj/script.sh; cat proj/keep.txt"
    )
    assert r.stdout == "top\nleaf\nnested/deeper/leaf.txt\nleaf\nrun\nkeep\n", r.stderr
    assert await sb.read_file(f"{sb.workdir}/proj/nested/blob.bin") == blob

    await sb.exec("echo added > proj/nested/new.txt")
    out = tmp_path / "out" / "proj"
    await sb.download("proj", out)
    assert (out / "top.txt").read_text() == "top\n"
    assert (out / "keep.txt").read_text() == "keep\n"
    assert (out / "nested" / "deeper" / "leaf.txt").read_text() == "leaf"
    assert (out / "nested" / "blob.bin").read_bytes() == blob
    assert (out / "nested" / "new.txt").read_text() == "added\n"
    assert os.readlink(out / "link") == "nested/deeper/leaf.txt"
    assert os.access(out / "script.sh", os.X_OK)
    assert sorted(p.name for p in out.parent.iterdir()) == ["proj"]  # no temporary leftovers

    single = tmp_path / "single.bin"
    single.write_bytes(b"\x00\x01single")
    await sb.upload(single, "x/renamed.bin")
    assert await sb.read_file("x/renamed.bin") == b"\x00\x01single"
    dest = tmp_path / "dl" / "copy.bin"
    await sb.download("x/renamed.bin", dest)
    assert dest.read_bytes() == b"\x00\x01single"
    with pytest.raises(FileExistsError):
        await sb.download("x/renamed.bin", dest)


async def test_file_errors_leave_the_session_shell(any_sandbox: Sandbox, tmp_path: Path) -> None:
    """Transfers that fail raise the built-in error for it, and the agent's shell (its
    variables) lives on: a transfer's early exit is never the session's."""
    sb = any_sandbox
    await sb.exec("export KEPT=yes; mkdir -p somedir")
    with pytest.raises(FileNotFoundError):
        await sb.read_file("missing.txt")
    with pytest.raises(FileNotFoundError):
        await sb.read_file("no/such/dir/file")
    with pytest.raises(IsADirectoryError):
        await sb.read_file("somedir")
    with pytest.raises(IsADirectoryError):
        await sb.read_file("/")
    with pytest.raises(IsADirectoryError):
        await sb.write_file("somedir", b"x")
    with pytest.raises(FileNotFoundError):
        await sb.upload(tmp_path / "nope", "nope")
    with pytest.raises(FileNotFoundError):
        await sb.download("nope", tmp_path / "nope")
    assert not (tmp_path / "nope").exists()
    assert (await sb.exec('echo "$KEPT"')).stdout == "yes\n"


async def test_only_regular_files_under_the_cap_are_read(
    any_sandbox: Sandbox, tmp_path: Path
) -> None:
    """A device or a FIFO (also behind a link) is refused without blocking, a file over the
    cap before its data is read (a 1 GB sparse file is never copied), a tree over the cap is
    not downloaded; a link to a regular file is followed."""
    sb = any_sandbox
    await sb.exec("ln -s /dev/zero zero; mkfifo fifo; truncate -s 1G sparse; printf abc > f")
    await sb.exec("ln -s f link; mkdir d && head -c 3000 /dev/urandom > d/z")
    for path in ("zero", "fifo"):
        with pytest.raises(OSError) as refused:
            await asyncio.wait_for(sb.read_file(path), PATIENCE_S)
        assert not isinstance(refused.value, FileNotFoundError)
    with pytest.raises(OSError) as big:
        await sb.read_file("sparse")
    assert big.value.errno == errno.EFBIG
    assert await sb.read_file("f", max_bytes=3) == b"abc"
    with pytest.raises(OSError) as over:
        await sb.read_file("f", max_bytes=2)
    assert over.value.errno == errno.EFBIG
    assert await sb.read_file("link") == b"abc"
    with pytest.raises(OSError) as tree:
        await sb.download("d", tmp_path / "capped", max_bytes=2000)
    assert tree.value.errno == errno.EFBIG and not (tmp_path / "capped").exists()
    await sb.download("d", tmp_path / "whole")
    assert (tmp_path / "whole" / "z").stat().st_size == 3000


@pytest.mark.parametrize(
    "any_sandbox", [pytest.param("bwrap-ro", marks=requires_bwrap), "unsafe-local"], indirect=True
)
async def test_big_files_move_through_threads(
    any_sandbox: Sandbox, gated_executor: GatedExecutor, tmp_path: Path
) -> None:
    """Above `BIG_FILE` the host reads, writes, copies and removes a file in a thread, never
    on the event loop (whole-file steps of 256 MiB take 100 ms and more, which every other
    rollout would wait for; `clotho bench` is where such durations are measured). Each
    transfer is held at a shut gate in front of the thread pool: it can only be pending
    there, with the loop free, if its work is in a thread."""
    sb = any_sandbox
    data = random.Random(3).randbytes(8 * BIG_FILE)
    big = tmp_path / "big.bin"
    big.write_bytes(data)
    assert await gated_executor.hops(sb.write_file("written.bin", data)) >= 1
    back: list[bytes] = []

    async def read() -> None:
        back.append(await sb.read_file("written.bin", max_bytes=1 << 30))

    assert await gated_executor.hops(read()) >= 1
    assert await gated_executor.hops(sb.upload(big, "uploaded.bin")) >= 1
    assert await gated_executor.hops(sb.download("uploaded.bin", tmp_path / "downloaded.bin")) >= 1
    assert back == [data]
    assert (tmp_path / "downloaded.bin").read_bytes() == data
    assert (await sb.exec("cmp written.bin uploaded.bin && echo same")).stdout == "same\n"
