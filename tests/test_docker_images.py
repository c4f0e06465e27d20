"""Task images (sandbox/docker/images.py): content-hashed tags, built once, rebuilt on demand.

The Docker tests are skipped with the reason shown when no Docker daemon answers; in CI
(CI=true) its absence fails them instead.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import DOCKER_PROBLEM, IN_CI, requires_docker  # noqa: F401
from tests.sandbox_fixtures import BASE_IMAGE, write_context

from clotho.errors import TaskError
from clotho.sandbox import open_sandbox
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker.images import (
    IMAGE_LABEL,
    context_hash,
    ensure_context_image,
    image_exists,
)

pytest_plugins = ("tests.sandbox_fixtures",)  # tags, builds


def expected_tag(context: Path, slug: str) -> str:
    return f"clotho-env/{slug}:{context_hash(context)[:16]}"


# --- context_hash ----------------------------------------------------------------------------


def test_context_hash_follows_content_and_mode_only(tmp_path: Path) -> None:
    files = {"data.txt": "hello\n", "sub/script.sh": "#!/bin/sh\necho hi\n"}
    a = write_context(tmp_path / "a", "FROM scratch\n", files)
    b = write_context(tmp_path / "elsewhere" / "b", "FROM scratch\n", files)
    h = context_hash(a)
    assert len(h) == 64 and int(h, 16) >= 0
    assert context_hash(b) == h  # the location does not matter
    assert context_hash(a) == h  # stable

    os.utime(a / "data.txt", (1, 1))  # timestamps do not matter
    assert context_hash(a) == h

    (a / "data.txt").write_text("hello!\n")
    changed = context_hash(a)
    assert changed != h
    (a / "data.txt").write_text("hello\n")
    assert context_hash(a) == h

    (a / "sub" / "script.sh").chmod(0o755)
    assert context_hash(a) != h
    (a / "sub" / "script.sh").chmod(0o644)
    assert context_hash(a) == h

    (a / "data.txt").rename(a / "renamed.txt")
    assert context_hash(a) != h
    (a / "renamed.txt").rename(a / "data.txt")
    assert context_hash(a) == h

    (a / "empty").mkdir()
    assert context_hash(a) != h
    (a / "empty").rmdir()

    (a / "link").symlink_to("data.txt")
    linked = context_hash(a)
    assert linked != h
    (a / "link").unlink()
    (a / "link").symlink_to("sub/script.sh")
    assert context_hash(a) not in (h, linked)
    (a / "link").unlink()
    assert context_hash(a) == h


# --- building --------------------------------------------------------------------------------


@requires_docker
async def test_built_once_then_reused_and_force_rebuilds(
    docker: Any, tags: list[str], tmp_path: Path
) -> None:
    token = secrets.token_hex(4)
    context = write_context(
        tmp_path / "ctx",
        f"FROM {BASE_IMAGE}\nCOPY token.txt /opt/token.txt\n",
        {"token.txt": token},
    )
    name = f"Test Image_{token}!"
    tag = expected_tag(context, f"test-image_{token}")
    tags.append(tag)
    assert not await image_exists(docker, tag)

    assert await ensure_context_image(docker, context, name) == tag
    first = await docker.images.inspect(tag)
    assert first["Config"]["Labels"][IMAGE_LABEL] == context_hash(context)[:16]
    assert first["Config"]["Labels"]["clotho"] == "1"

    # Second call: the same tag, no build (the image is untouched).
    assert await ensure_context_image(docker, context, name) == tag
    second = await docker.images.inspect(tag)
    assert (second["Id"], second["Created"]) == (first["Id"], first["Created"])

    # Point the tag at another image: only a build can bring the built one back.
    base_id = (await docker.images.inspect(BASE_IMAGE))["Id"]
    repo, _, version = tag.rpartition(":")
    await docker.images.tag(BASE_IMAGE, repo, tag=version)
    assert await ensure_context_image(docker, context, name) == tag
    assert (await docker.images.inspect(tag))["Id"] == base_id  # not rebuilt
    assert await ensure_context_image(docker, context, name, force=True) == tag
    rebuilt = await docker.images.inspect(tag)
    assert rebuilt["Id"] != base_id
    assert rebuilt["Config"]["Labels"][IMAGE_LABEL] == context_hash(context)[:16]


@requires_docker
async def test_concurrent_requests_build_once(
    docker: Any, tags: list[str], builds: list[str], tmp_path: Path
) -> None:
    token = secrets.token_hex(4)
    context = write_context(
        tmp_path / "ctx", f"FROM {BASE_IMAGE}\nCOPY token.txt /opt/\n", {"token.txt": token}
    )
    tags.append(expected_tag(context, f"conc-{token}"))
    locks: dict[str, asyncio.Lock] = {}
    results = await asyncio.gather(
        *(ensure_context_image(docker, context, f"conc-{token}", locks=locks) for _ in range(3))
    )
    assert results == [tags[0]] * 3
    assert builds == [tags[0]]


@requires_docker
async def test_failing_dockerfile_raises_with_the_build_log(
    docker: Any, tags: list[str], tmp_path: Path
) -> None:
    token = secrets.token_hex(4)
    context = write_context(
        tmp_path / "broken",
        f"FROM {BASE_IMAGE}\nRUN echo about-to-fail-{token} && exit 3\n",
    )
    tag = expected_tag(context, f"broken-{token}")
    tags.append(tag)
    with pytest.raises(TaskError) as info:  # the task's fault: --resume does not retry it
        await ensure_context_image(docker, context, f"broken-{token}")
    message = str(info.value)
    assert str(context) in message
    assert "returned a non-zero code: 3" in message
    assert f"about-to-fail-{token}" in message  # the output of the failing step
    assert not await image_exists(docker, tag)


@requires_docker
async def test_container_sees_the_copied_files(
    docker: Any, tags: list[str], tmp_path: Path
) -> None:
    token = secrets.token_hex(4)
    context = write_context(
        tmp_path / "env",
        f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY . /app/\n",
        {"data.txt": f"payload {token}\n", "tools/run.sh": "#!/bin/sh\necho ran\n"},
    )
    (context / "tools" / "run.sh").chmod(0o755)
    tag = await ensure_context_image(docker, context, f"copy-{token}")
    tags.append(tag)
    async with await open_sandbox(DockerSandboxConfig(image=tag)) as sb:
        r = await sb.exec("cat data.txt && ./tools/run.sh && ls")
        assert r.exit_code == 0, r.stderr
        assert r.stdout == f"payload {token}\nran\nDockerfile\ndata.txt\ntools\n"
        assert await sb.read_file("/app/data.txt") == f"payload {token}\n".encode()


BUILD_RSS = """
import asyncio, sys
from pathlib import Path
import aiodocker
from clotho.sandbox.docker.images import build_image

async def main() -> None:
    docker = aiodocker.Docker()
    try:
        await build_image(docker, Path(sys.argv[1]), sys.argv[2])
    finally:
        await docker.close()

asyncio.run(main())
# VmHWM, the peak of this process's own memory: ru_maxrss would carry over the peak of the
# forked test process (Linux keeps it across exec).
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(int(hwm.split()[1]) // 1024)
"""


@requires_docker
async def test_a_big_build_context_is_streamed_not_held(
    docker: Any, tmp_path: Path, tags: list[str]
) -> None:
    """A 256 MiB context (random bytes: nothing compresses) builds in a process whose peak
    RSS stays far below the context's size (it was 3x the size with the tar in memory)."""
    import sys

    context = tmp_path / "ctx"
    context.mkdir()
    with (context / "big.bin").open("wb") as out:
        for _ in range(256):
            out.write(os.urandom(1 << 20))
    (context / "Dockerfile").write_text("FROM clotho/base:bookworm\nCOPY big.bin /big.bin\n")
    tag = f"clotho-test/bigctx:{secrets.token_hex(3)}"
    tags.append(tag)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BUILD_RSS, str(context), tag,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    peak_mb = int(out.split()[-1])
    assert peak_mb < 150, f"peak RSS {peak_mb} MB for a 256 MB context"
    assert await image_exists(docker, tag)
