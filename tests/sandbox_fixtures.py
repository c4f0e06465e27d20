"""What the sandbox tests share: one fixture per backend's sandbox (and one over all of them,
for the contract every backend keeps), the host-side process and mount probes, task images
made for a test, and a thread pool that shows whether a step leaves the event loop.

A test module loads the fixtures with `pytest_plugins = ("tests.sandbox_fixtures",)` and
imports the helpers. The contract tests themselves live in tests/test_sandbox_backends.py; a
backend's own behaviour stays in its own file.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import pytest
from tests.docker_probe import fail_without_docker_in_ci, requires_docker
from tests.support import PATIENCE_S, wait_until

from clotho.sandbox import LocalSandboxConfig, UnsafeLocalSandboxConfig, open_sandbox
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker import images
from clotho.sandbox.host import quota
from clotho.sandbox.local.bwrap import BwrapSandbox

P = ParamSpec("P")
T = TypeVar("T")

requires_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None,
    reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap",
)
requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="overlay, uids and cgroups need root")
requires_quota = pytest.mark.skipif(
    quota.unavailable() is not None, reason=str(quota.unavailable())
)

# The bubblewrap sandbox's two roots: the host's read-only, or an overlay (root only).
ROOT_MODES = ["ro", pytest.param("overlay", marks=requires_root)]


# --- processes on the host ---------------------------------------------------------------


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def host_pids(match: Callable[[bytes], bool]) -> list[int]:
    """Live host processes whose NUL-separated command line `match`es."""
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and match(cmdline(int(entry))) and alive(int(entry))
    ]


def pids_with_argv0(token: str) -> list[int]:
    """Live host processes whose argv[0] starts with `token` (`exec -a token-... cmd`)."""
    return host_pids(lambda line: line.startswith(token.encode()))


def processes_mentioning(text: str) -> list[int]:
    """Live host processes with `text` anywhere in their arguments."""
    return host_pids(lambda line: text.encode() in line)


async def wait_dead(pids: Iterable[int]) -> list[int]:
    """Wait until none of `pids` is alive; the ones still alive when patience runs out."""
    pids = list(pids)
    await wait_until(lambda: not any(alive(p) for p in pids))
    return [p for p in pids if alive(p)]


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped): an owner known to be gone."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# --- mounts and disk images on the host -------------------------------------------------------


def mounts_at(path: Path) -> list[str]:
    """The mount points at `path` or below it."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p == str(path) or p.startswith(f"{path}/")]


def kernel_text(path: str) -> str:
    """A /proc or /sys file's text, "" when it is gone (a process ended, a device freed)."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def loop_backing(device: str) -> str:
    """The file a loop device is attached to, "" when it is free."""
    return kernel_text(f"/sys/block/{Path(device).name}/loop/backing_file")


def image_blocks(folder: Path) -> int:
    """Bytes the disk image of a quota'd `folder` (a sandbox's state, a container's layer)
    takes on the host: it lies in the folder, under the mount it backs, so a bind of the
    parent without its submounts shows it."""
    view = Path(tempfile.mkdtemp(prefix="clotho-under-"))
    subprocess.run(["mount", "--bind", str(folder.parent), str(view)], check=True)
    try:
        return (view / folder.name / quota.IMAGE_NAME).stat().st_blocks * 512
    finally:
        subprocess.run(["umount", str(view)], check=True)
        view.rmdir()


@contextlib.contextmanager
def outside_folder(tmp_path: Path) -> Iterator[Path]:
    """A host folder an agent's link points at: removal must not follow the link into it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("host data")
    yield outside
    assert (outside / "keep").read_text() == "host data"


@pytest.fixture
def docker_quota_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The containers' own file systems are opt-in (docker/quota.py): tests that judge them
    turn them on."""
    monkeypatch.setenv("CLOTHO_DOCKER_QUOTA", "1")


# --- sandboxes -----------------------------------------------------------------------------


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    """A bubblewrap sandbox with the default settings, where agents and tools run (a module
    that needs another kind of sandbox defines its own `sandbox`, which wins)."""
    sb = await open_sandbox(LocalSandboxConfig())
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture(params=ROOT_MODES)
def root_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def bwrap_sandbox(root_mode: str, tmp_path: Path) -> AsyncIterator[BwrapSandbox]:
    """A bubblewrap sandbox in each root mode, its state under the test's tmp_path."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    config = LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path / "state"))
    sb = await open_sandbox(config, labels={"clotho.test": "bwrap"})
    assert isinstance(sb, BwrapSandbox)
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture
async def docker_sandbox() -> AsyncIterator[Any]:
    """A Docker sandbox (a container of its own) on the base image."""
    fail_without_docker_in_ci()
    from clotho.sandbox.docker.sandbox import DockerSandbox

    sb = await open_sandbox(DockerSandboxConfig(), labels={"clotho.test": "docker"})
    assert isinstance(sb, DockerSandbox)
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture
async def unsafe_sandbox(tmp_path: Path) -> AsyncIterator[Sandbox]:
    """An unsafe-local sandbox: plain processes in a folder under the test's tmp_path."""
    config = UnsafeLocalSandboxConfig(state_dir=str(tmp_path / "state"), env={"EXTRA": "x y"})
    sb = await open_sandbox(config, labels={"k": "v"})
    try:
        yield sb
    finally:
        await sb.close()


BACKENDS = [
    pytest.param("bwrap-ro", marks=requires_bwrap),
    pytest.param("bwrap-overlay", marks=[requires_bwrap, requires_root]),
    "unsafe-local",
    pytest.param("docker", marks=requires_docker),
    pytest.param("docker-slot", marks=requires_docker),  # an isolated slot of a shared container
]


def _config(backend: str, state: Path) -> Any:
    if backend.startswith("bwrap-"):
        return LocalSandboxConfig(root=backend.removeprefix("bwrap-"), state_dir=str(state))
    if backend == "unsafe-local":
        return UnsafeLocalSandboxConfig(state_dir=str(state))
    fail_without_docker_in_ci()
    if backend == "docker":
        return DockerSandboxConfig()
    return DockerSandboxConfig(slots_per_container=2, slot_isolation="bwrap")


@pytest.fixture(params=BACKENDS)
async def any_sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Sandbox]:
    """A sandbox of each backend, for what every backend does alike. Paths in the tests are
    relative to the workdir (an unsafe-local sandbox's absolute paths are the host's)."""
    sb = await open_sandbox(_config(str(request.param), tmp_path / "state"), {"clotho.test": "any"})
    try:
        yield sb
    finally:
        await sb.close()


# --- task images ---------------------------------------------------------------------------

BASE_IMAGE = "clotho/base:bookworm"


def write_context(root: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    """A build context: the Dockerfile and `files` (relative path: content)."""
    root.mkdir(parents=True)
    (root / "Dockerfile").write_text(dockerfile)
    for rel, content in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    return root


@pytest.fixture
async def tags(docker: Any) -> AsyncIterator[list[str]]:
    """Image tags a test makes; removed afterwards (by tag: an image with other tags keeps
    them)."""
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


# --- the event loop ------------------------------------------------------------------------


_IN_STEP: contextvars.ContextVar[bool] = contextvars.ContextVar("in_step", default=False)


class GatedExecutor(ThreadPoolExecutor):
    """A default executor that holds the jobs of one step at a gate.

    With the gate shut, what the step hands to a thread (`asyncio.to_thread`) cannot finish:
    a step found pending then, with one of its own jobs parked at the gate, is waiting on a
    thread while the loop runs other work. That is causal proof of where its work happens,
    where a measured duration would only be a guess on a busy machine. Jobs of anything else
    (a storage watch, say) are told apart by context and pass."""

    def __init__(self) -> None:
        super().__init__(max_workers=4, thread_name_prefix="gated")
        self.gate = threading.Event()
        self.gate.set()
        self._count = threading.Lock()
        self.parked = 0  # the step's jobs waiting at the gate now
        self.jobs = 0  # the step's jobs so far

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        if not _IN_STEP.get():  # submit runs in the caller's context, on the loop
            return super().submit(fn, *args, **kwargs)

        def gated() -> T:
            with self._count:
                self.parked += 1
            self.gate.wait()
            with self._count:
                self.parked -= 1
            return fn(*args, **kwargs)

        self.jobs += 1
        return super().submit(gated)

    async def hops(self, step: Coroutine[Any, Any, T]) -> int:
        """Run `step` with the gate shut; return how many jobs it handed to a thread. Fails if
        it finishes without ever waiting for one."""
        self.gate.clear()
        self.jobs = 0
        context = contextvars.copy_context()
        context.run(_IN_STEP.set, True)  # the step and the tasks it starts carry the mark
        task = asyncio.get_running_loop().create_task(step, context=context)
        try:
            assert await wait_until(lambda: self.parked > 0 or task.done())
            assert not task.done(), "the step finished without a thread: it ran on the loop"
        finally:
            self.gate.set()
        await task
        return self.jobs


@pytest.fixture
async def gated_executor() -> AsyncIterator[GatedExecutor]:
    """The running loop's default executor, replaced by a `GatedExecutor` (gate open)."""
    executor = GatedExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    yield executor
    executor.gate.set()


# --- timeouts --------------------------------------------------------------------------------

R = TypeVar("R")

TIMEOUTS = (0.5, 5.0, PATIENCE_S)


async def run_past_timeout(
    run: Callable[[float], Awaitable[R]], started: Callable[[], bool | Awaitable[bool]]
) -> R:
    """`run(timeout)` a command that never ends by itself, under growing timeouts, until its
    timeout came after it `started()` (set up what the test then looks at: a busy machine
    can fire a short timeout first). What a timeout kills is then known to have existed."""
    for timeout in TIMEOUTS:
        result = await run(timeout)
        held = started()
        if not isinstance(held, bool):
            held = await held
        if held:
            return result
    raise AssertionError(f"the command had not started when a {PATIENCE_S:g} s timeout ended it")


@pytest.fixture
async def slot_host() -> AsyncIterator[Any]:
    """A `SlotHost` (several sandboxes per container) with a Docker client of its own."""
    fail_without_docker_in_ci()
    import aiodocker

    from clotho.sandbox.docker.slots import SlotHost

    host = SlotHost(aiodocker.Docker(), owns_client=True)
    try:
        yield host
    finally:
        await host.close()
