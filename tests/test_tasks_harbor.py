"""Loading Harbor task directories, and the errors a malformed one gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from clotho.errors import TaskError
from clotho.tasks.harbor import discover_tasks, load_task


def test_load_reads_metadata_and_timeouts(make_task) -> None:
    path = make_task("alpha", category="git", toml_extra='[environment]\ndocker_image = "img:1"\n')
    task = load_task(path)
    assert task.name == "alpha"
    assert task.category == "git"
    assert task.config.verifier.timeout_sec == 30.0
    assert task.config.agent.timeout_sec == 60.0
    assert task.config.environment.docker_image == "img:1"
    assert task.instruction == "Write ok into /app/done.txt."


def test_unknown_fields_are_kept_not_rejected(make_task) -> None:
    path = make_task(toml_extra='[environment]\nfuture_field = "x"\n')
    assert load_task(path).config.environment.model_extra == {"future_field": "x"}


def test_bad_toml_names_the_file(make_task) -> None:
    path = make_task()
    (path / "task.toml").write_text("version = \n")
    with pytest.raises(TaskError, match=r"task\.toml: invalid TOML"):
        load_task(path)


def test_wrong_type_names_section_and_field(make_task) -> None:
    path = make_task()
    (path / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n')
    with pytest.raises(TaskError) as info:
        load_task(path)
    message = str(info.value)
    assert "task.toml" in message
    assert "[verifier].timeout_sec" in message
    assert "'soon'" in message


def test_negative_timeout_is_rejected(make_task) -> None:
    path = make_task()
    (path / "task.toml").write_text("[agent]\ntimeout_sec = -1\n")
    with pytest.raises(TaskError, match=r"\[agent\]\.timeout_sec"):
        load_task(path)


@pytest.mark.parametrize(
    ("remove", "expected"),
    [("instruction.md", "instruction.md: missing"), ("tests/test.sh", "test.sh: missing")],
)
def test_missing_required_files(make_task, remove: str, expected: str) -> None:
    path = make_task()
    (path / remove).unlink()
    with pytest.raises(TaskError, match=expected):
        load_task(path)


def test_discover_keeps_good_tasks_and_reports_bad_ones(make_task, tmp_path: Path) -> None:
    make_task("good-1")
    make_task("good-2")
    bad = make_task("bad")
    (bad / "task.toml").write_text("[metadata]\ntags = 3\n")
    (tmp_path / "tasks" / "not-a-task").mkdir()  # no task files: ignored, not an error
    tasks, errors = discover_tasks([tmp_path / "tasks"])
    assert sorted(t.name for t in tasks) == ["good-1", "good-2"]
    assert len(errors) == 1
    assert errors[0][0].name == "bad"
    assert "[metadata].tags" in str(errors[0][1])


def test_discover_accepts_a_single_task_dir_and_reports_missing_paths(make_task, tmp_path) -> None:
    path = make_task("solo")
    tasks, errors = discover_tasks([path, tmp_path / "nowhere"])
    assert [t.name for t in tasks] == ["solo"]
    assert len(errors) == 1 and "no such task directory" in str(errors[0][1])


def test_bundled_examples_load(examples_dir: Path) -> None:
    tasks, errors = discover_tasks([examples_dir])
    assert errors == []
    assert len(tasks) >= 10
    assert len({t.category for t in tasks}) >= 4
