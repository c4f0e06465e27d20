"""Loading Harbor task directories, and the errors a malformed one gets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clotho.errors import TaskError
from clotho.tasks import harbor
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


# --- resources: every spelling Harbor reads, normalised ---------------------------------


@pytest.mark.parametrize(
    ("environment", "cpus", "memory_mb", "storage_mb"),
    [
        ("cpus = 2\nmemory_mb = 2048\nstorage_mb = 10240\n", 2.0, 2048, 10240),
        # Terminal-Bench 2.0 writes Harbor's older string spellings.
        ('cpus = 1\nmemory = "2G"\nstorage = "10G"\n', 1.0, 2048, 10240),
        ('cpus = "2"\nmemory = "512M"\n', 2.0, 512, None),
        ('cpus = 0.5\nmemory = "2GB"\nstorage = "1.5g"\n', 0.5, 2048, 1536),
        ('memory = "2Gi"\nstorage = "1TiB"\n', None, 2048, 1024 * 1024),
        ('memory = " 4096k "\n', None, 4, None),
        ('memory = "2G"\nmemory_mb = 2048\n', None, 2048, None),  # both, agreeing
        ("", None, None, None),  # no limits set
    ],
)
def test_resource_spellings_are_normalised(
    make_task, environment: str, cpus: float | None, memory_mb: int | None, storage_mb: int | None
) -> None:
    env = load_task(make_task(toml_extra="[environment]\n" + environment)).config.environment
    assert (env.cpus, env.memory_mb, env.storage_mb) == (cpus, memory_mb, storage_mb)
    assert "memory" not in env.model_dump() and "storage" not in env.model_dump()


def test_harbor_environment_fields_are_read(make_task) -> None:
    path = make_task(
        toml_extra='[environment]\ngpus = 1\ngpu_types = ["H100"]\nallow_internet = true\n'
        'build_timeout_sec = 900\ndocker_image = "img:2"\n'
    )
    env = load_task(path).config.environment
    assert (env.gpus, env.gpu_types, env.allow_internet) == (1, ["H100"], True)
    assert (env.build_timeout_sec, env.docker_image) == (900.0, "img:2")
    assert load_task(make_task("plain")).config.environment.allow_internet is False


@pytest.mark.parametrize(
    ("environment", "field"),
    [
        ('memory = "lots"\n', "[environment].memory"),
        ('memory = "-2G"\n', "[environment].memory"),
        ('memory = "0G"\n', "[environment].memory"),
        ('memory = "100K"\n', "[environment].memory"),  # less than 1 MB
        ("memory = 2048\n", "[environment].memory"),  # no unit: say memory_mb
        ('storage = "2 bananas"\n', "[environment].storage"),
        ('storage = "99999999999T"\n', "[environment].storage"),
        ('memory = "' + "9" * 5000 + 'G"\n', "[environment].memory"),
        ("memory_mb = -1\n", "[environment].memory_mb"),
        ("memory_mb = 0\n", "[environment].memory_mb"),
        ("memory_mb = 2048.5\n", "[environment].memory_mb"),
        ('memory_mb = "2G"\n', "[environment].memory_mb"),
        ("memory_mb = true\n", "[environment].memory_mb"),
        ("memory_mb = 0x" + "f" * 3000 + "\n", "[environment].memory_mb"),
        ("storage_mb = 1e9999\n", "[environment].storage_mb"),
        ("cpus = 0\n", "[environment].cpus"),
        ("cpus = -2\n", "[environment].cpus"),
        ('cpus = "many"\n', "[environment].cpus"),
        ("cpus = nan\n", "[environment].cpus"),
        ("cpus = inf\n", "[environment].cpus"),
        ("cpus = true\n", "[environment].cpus"),
        ("gpus = -1\n", "[environment].gpus"),
        ("build_timeout_sec = inf\n", "[environment].build_timeout_sec"),
        ('memory = "1G"\nmemory_mb = 2048\n', "[environment]: "),  # they disagree
    ],
)
def test_unreadable_resource_spellings_name_file_and_field(
    make_task, environment: str, field: str
) -> None:
    path = make_task(toml_extra="[environment]\n" + environment)
    with pytest.raises(TaskError) as info:
        load_task(path)
    message = str(info.value)
    assert f"{path / 'task.toml'}: " in message and field in message
    assert len(message) < 600  # a 5,000-digit value is not echoed whole


def test_a_number_too_long_for_python_is_a_task_error(make_task) -> None:
    path = make_task()
    (path / "task.toml").write_text("[environment]\nmemory_mb = " + "9" * 5000 + "\n")
    with pytest.raises(TaskError, match=r"task\.toml: invalid TOML: line 2 \(memory_mb\)"):
        load_task(path)


def test_deeply_nested_toml_is_a_task_error(make_task) -> None:
    path = make_task()
    (path / "task.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(TaskError, match=r"task\.toml: invalid TOML"):
        load_task(path)


def test_newer_harbor_keys_do_not_invalidate_a_task(make_task) -> None:
    path = make_task(
        toml_extra='[environment]\nnetwork_mode = "no-network"\n[environment.healthcheck]\n'
        'command = "true"\n[solution.env]\nX = "1"\n'
    )
    config = load_task(path).config
    assert config.environment.model_extra == {
        "network_mode": "no-network",
        "healthcheck": {"command": "true"},
    }
    assert config.model_extra == {"solution": {"env": {"X": "1"}}}


def test_section_that_is_not_a_table(make_task) -> None:
    path = make_task()
    (path / "task.toml").write_text('environment = "big"\n')
    with pytest.raises(TaskError, match=r"task\.toml: \[environment\]: must be a table"):
        load_task(path)


@pytest.mark.parametrize(
    "entry",
    ['"1BAD" = "x"', '"A=B" = "x"', '"" = "x"', '"A\\nB" = "x"', '"A B" = "x"', 'A = "x\\u0000y"'],
)
def test_verifier_env_with_an_invalid_variable_is_a_task_error(make_task, entry: str) -> None:
    path = make_task(toml_extra=f"[verifier.env]\n{entry}\n")
    with pytest.raises(TaskError, match=r"task\.toml: \[verifier\]\.env: "):
        load_task(path)


def test_verifier_env_with_valid_names_loads(make_task) -> None:
    path = make_task(toml_extra='[verifier.env]\n_A1 = "x=y\\nz"\nPATH = "/bin"\n')
    assert load_task(path).config.verifier.env == {"_A1": "x=y\nz", "PATH": "/bin"}


# --- bad input never stops a run -----------------------------------------------------------


@pytest.mark.parametrize("name", ["instruction.md", "task.toml"])
def test_invalid_utf8_is_an_error_for_that_task_only(make_task, tmp_path: Path, name) -> None:
    make_task("good")
    bad = make_task("bad")
    (bad / name).write_bytes(b'version = "1.0"\n# caf\xe9 \xff\xfe\n')
    with pytest.raises(TaskError, match=rf"{name}: not UTF-8 text"):
        load_task(bad)
    tasks, errors = discover_tasks([tmp_path / "tasks"])
    assert [t.name for t in tasks] == ["good"]
    assert [(p.name, "not UTF-8" in str(e)) for p, e in errors] == [("bad", True)]


def test_a_byte_order_mark_is_not_part_of_the_text(make_task) -> None:
    path = make_task()
    (path / "instruction.md").write_bytes(b"\xef\xbb\xbfDo it.")
    assert load_task(path).instruction == "Do it."


def test_task_folder_that_is_a_symlink_loop(make_task, tmp_path: Path) -> None:
    make_task("good")
    tasks_dir = tmp_path / "tasks"
    (tasks_dir / "self").symlink_to("self")
    (tasks_dir / "ping").symlink_to("pong")
    (tasks_dir / "pong").symlink_to("ping")
    tasks, errors = discover_tasks([tasks_dir])
    assert [t.name for t in tasks] == ["good"]
    reported = {p.name: str(e) for p, e in errors}
    assert sorted(reported) == ["ping", "pong", "self"]  # reported, not skipped silently
    assert all("symlink loop" in m for m in reported.values())
    # Given directly, a loop is an error too, and the other paths still load.
    tasks, errors = discover_tasks([tasks_dir / "self", tasks_dir / "good"])
    assert [t.name for t in tasks] == ["good"]
    assert len(errors) == 1 and "self: a symlink loop" in str(errors[0][1])
    with pytest.raises(TaskError, match="symlink loop"):
        load_task(tasks_dir / "ping")


def test_task_inside_a_folder_with_a_symlink_loop(make_task, tmp_path: Path) -> None:
    group = tmp_path / "tasks" / "group"
    make_task("inner", root=group)
    (group / "loop").symlink_to(group / "loop")
    (group / "up").symlink_to("..")  # a cycle through a parent: searched once
    tasks, errors = discover_tasks([tmp_path / "tasks"])
    assert [t.name for t in tasks] == ["inner"]
    assert [p.name for p, _ in errors] == ["loop"]


def test_symlink_loop_inside_a_task(make_task) -> None:
    path = make_task()
    (path / "instruction.md").unlink()
    (path / "instruction.md").symlink_to("instruction.md")
    with pytest.raises(TaskError, match=r"instruction\.md: a symlink loop"):
        load_task(path)


@pytest.mark.parametrize("target", ["/proc", "outside"])
def test_tests_folder_linking_out_of_the_task(make_task, tmp_path: Path, target: str) -> None:
    make_task("good")
    path = make_task("bad")
    outside = tmp_path / "outside"
    (outside / "tests").mkdir(parents=True)
    (outside / "tests" / "test.sh").write_text("echo 1\n")
    shutil.rmtree(path / "tests")
    (path / "tests").symlink_to("/proc" if target == "/proc" else outside / "tests")
    with pytest.raises(TaskError, match=r"/tests: a symlink to .*, outside the task folder"):
        load_task(path)
    tasks, errors = discover_tasks([tmp_path / "tasks"])
    assert [t.name for t in tasks] == ["good"] and [p.name for p, _ in errors] == ["bad"]


@pytest.mark.parametrize("name", ["instruction.md", "task.toml", "environment", "solution"])
def test_no_task_file_may_link_out_of_the_task(make_task, tmp_path: Path, name: str) -> None:
    path = make_task()
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "file").write_text("host secret")
    if (path / name).is_dir():
        shutil.rmtree(path / name)
        (path / name).symlink_to(secret)
    else:
        (path / name).unlink()
        (path / name).symlink_to(secret / "file")
    with pytest.raises(TaskError, match=rf"{name}: a symlink to .*, outside the task folder"):
        load_task(path)


def test_links_inside_the_task_are_fine(make_task) -> None:
    path = make_task()
    (path / "docs").mkdir()
    (path / "instruction.md").rename(path / "docs" / "prompt.md")
    (path / "instruction.md").symlink_to("docs/prompt.md")
    (path / "tests" / "test.sh").rename(path / "check.sh")
    (path / "tests" / "test.sh").symlink_to("../check.sh")
    assert load_task(path).instruction == "Write ok into /app/done.txt."


def test_special_files_are_not_read(make_task) -> None:
    path = make_task()
    (path / "instruction.md").unlink()
    os.mkfifo(path / "instruction.md")  # reading it would block forever
    with pytest.raises(TaskError, match=r"instruction\.md: must be a regular file"):
        load_task(path)


def test_oversized_instruction_is_refused(make_task) -> None:
    path = make_task()
    with (path / "instruction.md").open("wb") as file:
        file.truncate(harbor.MAX_TEXT_BYTES + 1)
    with pytest.raises(TaskError, match=r"instruction\.md: larger than"):
        load_task(path)


def test_symlinked_folders_outside_the_searched_folder(make_task, tmp_path: Path) -> None:
    elsewhere = make_task("linked", root=tmp_path / "elsewhere")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "to-task").symlink_to(elsewhere)  # a task: loaded
    (tmp_path / "tasks" / "to-root").symlink_to("/")  # not a task: not searched, said so
    (tmp_path / "tasks" / "dangling").symlink_to(tmp_path / "nothing")
    tasks, errors = discover_tasks([tmp_path / "tasks"])
    assert [t.name for t in tasks] == ["linked"]
    assert [p.name for p, _ in errors] == ["to-root"]
    assert "outside" in str(errors[0][1]) and "pass it on the command line" in str(errors[0][1])


def test_deep_folders_do_not_exhaust_the_stack(make_task, tmp_path: Path) -> None:
    levels = [tmp_path / "tasks"]
    levels[0].mkdir()
    for _ in range(sys.getrecursionlimit() + 100):
        levels.append(levels[-1] / "d")
        levels[-1].mkdir()  # one level at a time: Path.mkdir(parents=True) recurses
    try:
        make_task("bottom", root=levels[-1])
        tasks, errors = discover_tasks([levels[0]])
        assert [t.name for t in tasks] == ["bottom"] and errors == []
    finally:  # bottom up: shutil.rmtree (and pytest's own clean-up) would recurse too deep
        shutil.rmtree(levels[-1] / "bottom")
        for level in reversed(levels):
            level.rmdir()


def _discover_without_root_privileges(folder: Path) -> tuple[list[str], list[str]]:
    """Discovery in a child process that file permissions apply to (root drops the
    capabilities that bypass them), as a user whose folder cannot be read would run it."""
    code = (
        "import json, sys\nfrom pathlib import Path\n"
        "from clotho.tasks.harbor import discover_tasks\n"
        "tasks, errors = discover_tasks([Path(sys.argv[1])])\n"
        "print(json.dumps([[t.name for t in tasks], [str(e) for _, e in errors]]))\n"
    )
    command = [sys.executable, "-c", code, str(folder)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permissions cannot be tested")
        caps = "-dac_override,-dac_read_search"
        command = ["setpriv", "--bounding-set", caps, "--inh-caps", caps, *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    names, messages = json.loads(proc.stdout)
    return names, messages


@pytest.mark.parametrize("locked", ["task", "folder", "file"])
def test_unreadable_paths_are_errors_for_them_only(make_task, tmp_path: Path, locked) -> None:
    make_task("good")
    if locked == "task":
        target = make_task("locked")
    elif locked == "folder":
        target = tmp_path / "tasks" / "group"
        make_task("inner", root=target)
    else:
        target = make_task("locked") / "instruction.md"
    target.chmod(0)
    try:
        names, messages = _discover_without_root_privileges(tmp_path / "tasks")
    finally:
        target.chmod(0o755)
    assert names == ["good"]
    assert len(messages) == 1 and "Permission denied" in messages[0]
    assert str(target) in messages[0]
