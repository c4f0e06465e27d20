"""Terminal-Bench 2.0 dataset rows (base64 tarballs) and compose-built environments."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.test_eval_cli import clotho, results

from clotho.tasks import rows as rows_module
from clotho.tasks.harbor import discover_tasks


def b64_tar(files: dict[str, str]) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


CHECK = 'mkdir -p /logs/verifier; [ "$(cat /app/data.txt)" = seeded ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n'


def row(name: str, **extra: object) -> dict[str, object]:
    data: dict[str, object] = {
        "task_name": name,
        "category": "rows",
        "instruction": "Leave /app/data.txt alone.",
        "environment_tar": b64_tar({"data.txt": "seeded"}),
        "tests_tar": b64_tar({"helper.txt": "x"}),
        "test_sh": CHECK,
    }
    data.update(extra)
    return data


def test_rows_become_task_directories(tmp_path: Path) -> None:
    rows = tmp_path / "tb2.jsonl"
    rows.write_text(
        json.dumps(row("alpha", docker_image="img:1", difficulty="hard")) + "\n"
        + json.dumps(row("beta")) + "\n"
        + json.dumps({"task_name": "gamma"}) + "\n"
        + json.dumps(row("delta", environment_tar="%%%not base64")) + "\n"
        + "{broken\n"
    )  # fmt: skip
    tasks, errors = discover_tasks([rows], rows_cache=tmp_path / "cache")
    by_name = {t.name: t for t in tasks}
    assert sorted(by_name) == ["alpha", "beta"]
    alpha = by_name["alpha"]
    assert alpha.category == "rows" and alpha.config.metadata.difficulty == "hard"
    assert alpha.config.environment.docker_image == "img:1"
    assert (alpha.environment_dir / "data.txt").read_text() == "seeded"
    assert (alpha.tests_dir / "helper.txt").is_file() and (alpha.tests_dir / "test.sh").is_file()
    messages = sorted(str(e) for _, e in errors)
    assert len(messages) == 3
    assert any("tb2.jsonl:3" in m and "instruction" in m for m in messages)
    assert any("tb2.jsonl:4" in m and "environment_tar" in m for m in messages)
    assert any("tb2.jsonl:5" in m and "not valid JSON" in m for m in messages)
    # A second load reuses the unpacked folders.
    again, _ = discover_tasks([rows], rows_cache=tmp_path / "cache")
    assert {t.path for t in again} == {t.path for t in tasks}


@pytest.mark.bwrap
def test_eval_runs_rows_on_the_local_backend(tmp_path: Path) -> None:
    rows = tmp_path / "tb2.json"
    rows.write_text(json.dumps([row("one"), row("two")]))
    out = tmp_path / "run"
    proc = clotho(
        "eval",
        str(rows),
        "--agent",
        "nop",
        "--out",
        str(out),
        env={"XDG_CACHE_HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    assert {r["task"]: r["reward"] for r in results(out)} == {"one": 1.0, "two": 1.0}


# --- hostile rows: an error for that row only --------------------------------------------


def raw_tar(add: Callable[[tarfile.TarFile], None], mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        add(tar)
    return buffer.getvalue()


def add_file(tar: tarfile.TarFile, name: str, data: bytes = b"x") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def add_link(tar: tarfile.TarFile, name: str, target: str, kind: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    tar.addfile(info)


def unsafe(add: Callable[[tarfile.TarFile], None]) -> str:
    return base64.b64encode(raw_tar(add)).decode()


def discover_rows(tmp_path: Path, *rows: object) -> tuple[list[str], dict[str, str]]:
    path = tmp_path / "tb2.jsonl"
    lines = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows]
    path.write_bytes(b"\n".join(lines) + b"\n")
    tasks, errors = discover_tasks([path], rows_cache=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*/.*")), "a half-unpacked folder was left"
    return sorted(t.name for t in tasks), {p.name: str(e) for p, e in errors}


ESCAPES = {
    "dotdot": lambda tar: add_file(tar, "../escaped.txt"),
    "deep-dotdot": lambda tar: add_file(tar, "sub/../../../escaped.txt"),
    "absolute": lambda tar: add_file(tar, "/tmp/escaped-absolute.txt"),
    "symlink-out": lambda tar: add_link(tar, "link", "../../escaped.txt", tarfile.SYMTYPE),
    "symlink-absolute": lambda tar: add_link(tar, "link", "/etc/passwd", tarfile.SYMTYPE),
    "symlink-then-write": lambda tar: (
        add_link(tar, "d", "..", tarfile.SYMTYPE),
        add_file(tar, "d/escaped.txt"),
    ),
    "hardlink-out": lambda tar: add_link(tar, "hard", "/etc/passwd", tarfile.LNKTYPE),
    "hardlink-dotdot": lambda tar: add_link(tar, "hard", "../../x", tarfile.LNKTYPE),
    "device": lambda tar: add_link(tar, "null", "", tarfile.CHRTYPE),
}


@pytest.mark.parametrize("escape", sorted(ESCAPES))
@pytest.mark.parametrize("field", ["environment_tar", "tests_tar"])
def test_tar_member_escaping_the_target_fails_that_row(tmp_path: Path, escape, field) -> None:
    names, errors = discover_rows(
        tmp_path, row("good"), row("evil", **{field: unsafe(ESCAPES[escape])})
    )
    assert names == ["good"]
    assert list(errors) == ["tb2-row2"]
    assert f"tb2.jsonl:2 [{field}]: unsafe archive member" in errors["tb2-row2"]
    assert not any(p.name == "escaped.txt" for p in tmp_path.rglob("*"))
    assert not Path("/tmp/escaped-absolute.txt").exists()


def test_links_inside_the_archive_are_kept(tmp_path: Path) -> None:
    def add(tar: tarfile.TarFile) -> None:
        add_file(tar, "data.txt", b"seeded")
        add_link(tar, "alias.txt", "data.txt", tarfile.SYMTYPE)
        add_link(tar, "hard.txt", "data.txt", tarfile.LNKTYPE)

    path = tmp_path / "tb2.jsonl"
    path.write_text(json.dumps(row("ok", environment_tar=unsafe(add))) + "\n")
    (task,), errors = discover_tasks([path], rows_cache=tmp_path / "cache")
    assert errors == []
    assert (task.environment_dir / "alias.txt").read_text() == "seeded"
    assert (task.environment_dir / "hard.txt").read_text() == "seeded"


def test_huge_member_is_refused_from_its_header(tmp_path: Path) -> None:
    # A header that declares 1 TiB, and no data: refused before anything is read or written.
    info = tarfile.TarInfo("huge.bin")
    info.size = 1024**4
    bomb = base64.b64encode(info.tobuf(format=tarfile.PAX_FORMAT)).decode()
    names, errors = discover_rows(tmp_path, row("good"), row("bomb", environment_tar=bomb))
    assert names == ["good"]
    assert "member 'huge.bin' is 1099511627776 bytes (the cap is" in errors["tb2-row2"]


def test_caps_on_member_size_total_and_count(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(rows_module, "MAX_MEMBER_BYTES", 1000)
    monkeypatch.setattr(rows_module, "MAX_ARCHIVE_BYTES", 2500)
    monkeypatch.setattr(rows_module, "MAX_MEMBERS", 5)

    def files(count: int, size: int) -> str:
        return unsafe(lambda tar: [add_file(tar, f"f{i}", b"0" * size) for i in range(count)])

    names, errors = discover_rows(
        tmp_path,
        row("fits", environment_tar=files(2, 1000)),
        row("big-member", environment_tar=files(1, 1001)),
        row("big-total", environment_tar=files(3, 900)),
        row("many", tests_tar=files(6, 1)),
    )
    assert names == ["fits"]
    assert "is 1001 bytes (the cap is 1000)" in errors["tb2-row2"]
    assert "unpacks to more than 2500 bytes" in errors["tb2-row3"]
    assert "[tests_tar]: more than 5 members" in errors["tb2-row4"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("%%%not base64", "not valid base64"),
        ("bm90IGEgdGFy", "not a usable tar archive"),  # base64 of "not a tar"
        ("w6k=\u00e9", "not valid base64"),  # not ASCII
        (base64.b64encode(raw_tar(lambda t: add_file(t, "a", b"x" * 5000))[:60]).decode(), ""),
    ],
)
def test_invalid_archives_fail_that_row(tmp_path: Path, value: str, expected: str) -> None:
    names, errors = discover_rows(tmp_path, row("good"), row("bad", environment_tar=value))
    assert names == ["good"]
    assert "tb2.jsonl:2 [environment_tar]: " + expected in errors["tb2-row2"]


def test_bad_lines_fail_only_themselves(tmp_path: Path) -> None:
    names, errors = discover_rows(
        tmp_path,
        row("good"),
        b'{"task_name": "latin1", "instruction": "caf\xe9"}',  # not UTF-8
        b"[" * 100_000 + b"]" * 100_000,  # nested beyond the recursion limit
        row("surrogate", instruction="\ud800"),  # valid JSON, no UTF-8 spelling
        row("bad-category", category="\ud800"),
        7,
        row("last"),
    )
    assert names == ["good", "last"]
    assert "tb2.jsonl:2: not UTF-8 text" in errors["tb2-row2"]
    assert "tb2.jsonl:3: not valid JSON" in errors["tb2-row3"]
    assert "tb2.jsonl:4: instruction: Value error, a lone surrogate" in errors["tb2-row4"]
    assert "tb2.jsonl:5: category: Value error, a lone surrogate" in errors["tb2-row5"]
    assert "tb2.jsonl:6: value: Input should be a valid dictionary" in errors["tb2-row6"]


@pytest.mark.parametrize("task_name", ["..", ".", "../../escaped", "/etc", "a/../..", "x" * 5000])
def test_task_names_cannot_leave_the_cache(tmp_path: Path, task_name: str) -> None:
    path = tmp_path / "tb2.jsonl"
    path.write_text(json.dumps(row(task_name)) + "\n")
    (task,), errors = discover_tasks([path], rows_cache=tmp_path / "cache")
    assert errors == []
    assert task.path.parent.parent == tmp_path / "cache"
    assert not task.name.startswith(".") and len(task.name) <= rows_module.MAX_SLUG


def test_unreadable_json_file_is_one_error(tmp_path: Path, make_task) -> None:
    make_task("plain")
    rows_file = tmp_path / "tb2.json"
    rows_file.write_bytes(b'[{"task_name": "caf\xe9"}]')
    tasks, errors = discover_tasks([rows_file, tmp_path / "tasks"], rows_cache=tmp_path / "c")
    assert [t.name for t in tasks] == ["plain"]
    assert len(errors) == 1 and "tb2.json: not UTF-8 text" in str(errors[0][1])


def test_test_sh_is_not_written_through_a_link(tmp_path: Path) -> None:
    def add(tar: tarfile.TarFile) -> None:
        add_file(tar, "helper.txt", b"keep")
        add_link(tar, "test.sh", "helper.txt", tarfile.SYMTYPE)

    path = tmp_path / "tb2.jsonl"
    path.write_text(json.dumps(row("t", tests_tar=unsafe(add))) + "\n")
    (task,), errors = discover_tasks([path], rows_cache=tmp_path / "cache")
    assert errors == []
    assert (task.tests_dir / "helper.txt").read_text() == "keep"
    assert not (task.tests_dir / "test.sh").is_symlink()
