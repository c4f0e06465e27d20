"""What a task asks of its sandbox: build context, prebuilt image and limits, nothing outside."""

from __future__ import annotations

import pytest

from clotho.errors import TaskError
from clotho.tasks.environment import environment_spec
from clotho.tasks.harbor import load_task


def test_a_dockerfile_task_asks_for_its_image_and_limits(make_task) -> None:
    path = make_task(
        env_files={"Dockerfile": "FROM clotho/base:bookworm\n"},
        toml_extra='[environment]\nmemory = "2G"\ncpus = 2\nstorage = "10G"\n',
    )
    spec = environment_spec(load_task(path))
    assert spec.context == (path / "environment").resolve()
    assert (spec.dockerfile, spec.cpus, spec.memory_mb, spec.storage_mb) == (
        "Dockerfile",
        2.0,
        2048,
        10240,
    )


def test_a_task_without_a_build_asks_for_nothing_to_build(make_task) -> None:
    spec = environment_spec(load_task(make_task()))
    assert spec.context is None and spec.image is None and spec.memory_mb is None


@pytest.mark.parametrize(
    "build",
    ["../..", "{context: /etc}", "{context: ., dockerfile: ../../../etc/passwd}"],
)
def test_a_compose_build_that_leaves_the_task_folder_is_a_task_error(make_task, build) -> None:
    compose = f"services:\n  main:\n    build: {build}\n"
    task = load_task(make_task(env_files={"docker-compose.yaml": compose}))
    with pytest.raises(TaskError, match="leaves the task folder"):
        environment_spec(task)


def test_a_compose_build_inside_the_task_is_used(make_task) -> None:
    compose = "services:\n  main:\n    build: {context: ./img, dockerfile: Containerfile}\n"
    path = make_task(
        env_files={"docker-compose.yaml": compose, "img/Containerfile": "FROM scratch\n"}
    )
    spec = environment_spec(load_task(path))
    assert spec.context == (path / "environment" / "img").resolve()
    assert spec.dockerfile == "Containerfile"
