"""Datasets (`clotho.data`): local JSONL / JSON / Parquet files read record by record, a field
mapping, a limit, a Hugging Face dataset through `datasets` (a local dataset folder and a
cached Hub dataset read offline, for real), and SWE instances and Terminal-Bench rows from
Parquet and from a dataset, up to `clotho eval --agent oracle` on the bundled toy instances.

Parquet files are written with pyarrow here; `datasets` tests are skipped without it (make
test installs it). The only test double is `UnreachableHub`: no Hub is reachable here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.test_tasks_rows import row

from clotho.data import (
    DatasetSource,
    HubUnreachable,
    Record,
    load_records,
    read_records,
    stream_records,
)
from clotho.data import files as files_module
from clotho.errors import ConfigError, TaskError
from clotho.swe.examples import TOY_INSTANCES, build_toys
from clotho.swe.instance import is_instance_file, load_instances
from clotho.swe.trial import SweTrial
from clotho.tasks.discover import discover, discover_harbor
from clotho.tasks.harbor import discover_tasks

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def toy_records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in TOY_INSTANCES.read_text().splitlines() if line.strip()]


def write_parquet(path: Path, records: list[dict[str, Any]], **options: Any) -> Path:
    pq.write_table(pa.Table.from_pylist(records), path, **options)
    return path


def good(records: list[Record]) -> list[Any]:
    return [r.data for r in records if r.ok]


def bad(records: list[Record]) -> dict[str, str]:
    return {r.where.rsplit("/", 1)[-1]: str(r.error) for r in records if not r.ok}


# -- local files ---------------------------------------------------------------------------


def test_jsonl_bad_lines_fail_only_themselves(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"q": "first"}).encode() + b"\n"  # a BOM on line 1
        + b"{broken\n"
        + b'{"q": "caf\xe9"}\n'  # not UTF-8
        + b"\n"
        + b"[" * 100_000 + b"]" * 100_000 + b"\n"  # nested beyond the recursion limit
        + json.dumps({"q": "last"}).encode() + b"\r\n"
    )  # fmt: skip
    records = list(read_records(path))
    assert good(records) == [{"q": "first"}, {"q": "last"}]
    assert [r.number for r in records if r.ok] == [1, 6]
    errors = bad(records)
    assert sorted(errors) == ["items.jsonl:2", "items.jsonl:3", "items.jsonl:5"]
    assert "items.jsonl:2: not valid JSON" in errors["items.jsonl:2"]
    assert "items.jsonl:3: not UTF-8 text (byte 10)" in errors["items.jsonl:3"]
    assert "items.jsonl:5: not valid JSON: nested too deeply" in errors["items.jsonl:5"]


def test_an_overlong_line_is_skipped_without_being_held(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(files_module, "MAX_LINE_BYTES", 100)
    monkeypatch.setattr(files_module, "_CHUNK", 7)  # the rest is dropped in small pieces
    path = tmp_path / "items.jsonl"
    lines = [{"q": 1}, {"q": "x" * 500}, {"q": 3}]
    path.write_text("\n".join(json.dumps(x) for x in lines))  # no final newline
    records = list(read_records(path))
    assert good(records) == [{"q": 1}, {"q": 3}]
    assert "items.jsonl:2: longer than 100 bytes" in bad(records)["items.jsonl:2"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ([{"q": 1}, {"q": 2}], [{"q": 1}, {"q": 2}]),
        ({"instances": [{"q": 1}, {"q": 2}], "version": 3}, [{"q": 1}, {"q": 2}]),
        ({"rows": [{"q": 1}]}, [{"q": 1}]),
        ({"q": 1, "tags": ["a"]}, [{"q": 1, "tags": ["a"]}]),  # one object is one record
        # Two known keys with lists: which one holds the records is unclear, so the object
        # is one record (and its consumer says what is wrong with it).
        ({"rows": [1], "data": [2]}, [{"rows": [1], "data": [2]}]),
    ],
)
def test_json_list_object_with_a_list_or_one_object(
    tmp_path: Path, content: Any, expected: list[Any]
) -> None:
    path = tmp_path / "items.json"
    path.write_text(json.dumps(content))
    records = list(read_records(path))
    assert good(records) == expected
    assert [r.where.rsplit("/", 1)[-1] for r in records][:1] == ["items.json[0]"]


def test_an_unreadable_source_is_one_error_for_all_of_it(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('[{"q": 1},')
    (record,) = read_records(broken)
    assert record.whole_source and "broken.json: not valid JSON" in str(record.error)
    (missing,) = read_records(tmp_path / "missing.jsonl")
    assert missing.whole_source and "cannot be read: No such file" in str(missing.error)
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    (record,) = read_records(folder)
    assert "a folder, not a dataset file" in str(record.error)
    (record,) = read_records(tmp_path / "items.csv")
    assert "not a dataset file (.json, .jsonl" in str(record.error)
    not_parquet = tmp_path / "fake.parquet"
    not_parquet.write_text('{"q": 1}\n')
    (record,) = read_records(not_parquet)
    assert record.whole_source and "fake.parquet: not a readable Parquet file" in str(record.error)
    # `format` reads a file whose suffix says nothing.
    assert good(list(read_records(DatasetSource(path=str(not_parquet), format="jsonl")))) == [
        {"q": 1}
    ]


def test_parquet_is_read_in_batches_with_its_types_kept_as_json(tmp_path: Path) -> None:
    from datetime import datetime
    from decimal import Decimal

    records = [
        {
            "id": i,
            "tests": [f"t{i}", "t[a b]"],
            "meta": {"score": Decimal("1.50"), "at": datetime(2026, 1, 2, 3, 4, 5)},
            "note": None if i % 2 else "even",
        }
        for i in range(25)
    ]
    path = write_parquet(tmp_path / "items.parquet", records, row_group_size=10)
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    read = list(read_records(DatasetSource(path=str(path), batch_rows=4)))
    assert [r.number for r in read] == list(range(1, 26))
    assert read[3].where.endswith("items.parquet[3]")
    first = read[0].data
    assert first == {
        "id": 0,
        "tests": ["t0", "t[a b]"],
        "meta": {"score": 1.5, "at": "2026-01-02T03:04:05"},
        "note": "even",
    }
    json.dumps([r.data for r in read])  # every value is JSON again


def test_a_parquet_row_group_that_cannot_be_decoded_fails_only_its_rows(tmp_path: Path) -> None:
    records = [{"a": i, "s": f"row {i} " * 10} for i in range(30)]
    path = write_parquet(tmp_path / "items.parquet", records, row_group_size=10, compression="none")
    column = pq.ParquetFile(path).metadata.row_group(1).column(1)
    start = column.dictionary_page_offset or column.data_page_offset
    raw = bytearray(path.read_bytes())
    raw[start : start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    path.write_bytes(bytes(raw))
    read = list(read_records(path))
    assert [r.data["a"] for r in read if r.ok] == [*range(10), *range(20, 30)]
    (error,) = [r for r in read if not r.ok]
    assert error.where.endswith("items.parquet[10:20]") and error.number == 11
    assert "row group 1 cannot be decoded" in str(error.error)
    assert str(error.error).isprintable()


def test_field_mapping_renames_columns_and_names_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    lines = [{"question": "1+1?", "answer": "2", "id": 1}, {"answer": "4", "id": 2}, [1, 2]]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    # Atropos' spelling (`prompt_field`) and the plain one (`answer`).
    source = DatasetSource(path=str(path), fields={"prompt_field": "question", "target": "answer"})
    assert source.fields == {"prompt": "question", "target": "answer"}
    records = list(read_records(source))
    assert good(records) == [{"id": 1, "prompt": "1+1?", "target": "2"}]
    errors = bad(records)
    assert (
        "qa.jsonl:2: no column 'question' (fields.prompt); it has: answer, id"
        in errors["qa.jsonl:2"]
    )
    assert "qa.jsonl:3: expected an object, got list" in errors["qa.jsonl:3"]


def test_limit_counts_records_read_bad_ones_included(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    path.write_text('{"q": 1}\n{bad\n{"q": 3}\n{"q": 4}\n')
    records = list(read_records(DatasetSource(path=str(path), limit=3)))
    assert [r.number for r in records] == [1, 2, 3]
    assert good(records) == [{"q": 1}, {"q": 3}]
    parquet = write_parquet(tmp_path / "items.parquet", [{"q": i} for i in range(1000)])
    assert good(list(read_records(DatasetSource(path=str(parquet), limit=5)))) == [
        {"q": i} for i in range(5)
    ]


def test_sources_from_strings_and_their_mistakes() -> None:
    source = DatasetSource.parse(
        "hf:princeton-nlp/SWE-bench_Lite?split=test&config=default&limit=20&streaming=true"
        "&problem_statement_field=text&fields.repo=repository"
    )
    assert source.hub == "princeton-nlp/SWE-bench_Lite" and source.split == "test"
    assert source.limit == 20 and source.streaming is True and source.config == "default"
    assert source.fields == {"problem_statement": "text", "repo": "repository"}
    assert source.label == "hf:princeton-nlp/SWE-bench_Lite:default@test"
    assert DatasetSource.parse("data/items.parquet").path == "data/items.parquet"
    with pytest.raises(ConfigError, match="unknown option 'spilt'"):
        DatasetSource.parse("hf:a/b?spilt=test")
    with pytest.raises(ConfigError, match="limit: Input should be greater than or equal to 1"):
        DatasetSource.parse("hf:a/b?limit=0")
    with pytest.raises(ValueError, match="exactly one of `path`"):
        DatasetSource(path="a.jsonl", hub="a/b")
    with pytest.raises(ValueError, match="split: only for a `hub` dataset"):
        DatasetSource(path="a.jsonl", split="test")
    with pytest.raises(ValueError, match="field 'prompt' is mapped twice"):
        DatasetSource(path="a.jsonl", fields={"prompt": "q", "prompt_field": "question"})


async def test_async_readers_leave_the_event_loop_free(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "items.parquet", [{"q": i} for i in range(1000)])
    loaded = await load_records(DatasetSource(path=str(path), limit=10))
    assert good(loaded) == [{"q": i} for i in range(10)]
    seen = []
    async for record in stream_records(path, batch=64):
        seen.append(record.data["q"])
        if len(seen) == 150:
            break  # the reader is closed, not left half-way through the file
    assert seen == list(range(150))
    assert [r.data["q"] async for r in stream_records(path, batch=64)] == list(range(1000))


def test_without_pyarrow_parquet_names_the_extra(tmp_path: Path, monkeypatch) -> None:
    path = write_parquet(tmp_path / "items.parquet", [{"q": 1}])
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # `import` now fails
    with pytest.raises(ConfigError, match=r"pip install 'clotho-rl\[data\]'"):
        list(read_records(path))


# -- SWE instances and Terminal-Bench rows ------------------------------------------------


@pytest.fixture(scope="module")
def toys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy repositories (a folder of mirrors), as tests/test_swe.py builds them."""
    return build_toys(tmp_path_factory.mktemp("toys"))[0].parent


@pytest.fixture
def toy_parquet(tmp_path: Path) -> Path:
    return write_parquet(tmp_path / "toy.parquet", toy_records(), row_group_size=4)


def test_swe_instances_from_parquet_match_the_jsonl_ones(toy_parquet: Path) -> None:
    assert is_instance_file(toy_parquet)
    from_jsonl, errors = load_instances(TOY_INSTANCES)
    assert not errors
    from_parquet, errors = load_instances(toy_parquet)
    assert not errors
    assert [i.model_dump() for i in from_parquet] == [i.model_dump() for i in from_jsonl]
    not_instances = write_parquet(toy_parquet.with_name("other.parquet"), [{"q": 1}])
    assert not is_instance_file(not_instances)


def test_swe_columns_named_differently_are_mapped(tmp_path: Path) -> None:
    records = [
        {
            **{k: v for k, v in r.items() if k not in ("problem_statement", "FAIL_TO_PASS")},
            "issue": r["problem_statement"],
            "failing": json.dumps(r["FAIL_TO_PASS"]),  # SWE-bench's JSON string form
            "hints_text": None,  # a null in a known optional column: left out
        }
        for r in toy_records()[:3]
    ]
    records[2]["test_patch"] = None  # a null where a string is due: its default ("")
    records[1].pop("failing")  # a null in the Parquet column: the field is missing
    path = write_parquet(tmp_path / "renamed.parquet", records)
    source = DatasetSource(
        path=str(path), fields={"problem_statement": "issue", "FAIL_TO_PASS_field": "failing"}
    )
    instances, errors = load_instances(source)
    assert [i.instance_id for i in instances] == [
        records[0]["instance_id"],
        records[2]["instance_id"],
    ]
    assert instances[0].problem_statement == toy_records()[0]["problem_statement"]
    assert toy_records()[0]["FAIL_TO_PASS"] == instances[0].FAIL_TO_PASS
    assert instances[1].test_patch == "" and instances[0].hints_text is None
    assert "issue" not in (instances[0].model_extra or {})
    ((key, error),) = errors
    assert key == records[1]["instance_id"]
    assert "renamed.parquet[1]: instance" in str(error)
    assert "FAIL_TO_PASS: Field required" in str(error)


async def test_swe_environment_reads_dataset_sources(toy_parquet: Path, tmp_path: Path) -> None:
    from clotho.envs.swe import SweEnv, SweEnvConfig

    config = SweEnvConfig.model_validate(
        {
            "instances": [
                {"path": str(toy_parquet), "limit": 2},
                str(TOY_INSTANCES.parent / "real.jsonl"),
            ]
        }
    )
    instances = await SweEnv._load(config.instances)
    real, _ = load_instances(TOY_INSTANCES.parent / "real.jsonl")
    expected = [r["instance_id"] for r in toy_records()[:2]] + [i.instance_id for i in real]
    assert [i.instance_id for i in instances] == expected
    with pytest.raises(ConfigError, match="is also in an earlier source"):
        await SweEnv._load([str(toy_parquet), str(TOY_INSTANCES)])
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{bad\n")
    with pytest.raises(ConfigError, match=r"broken.jsonl:1: not valid JSON"):
        await SweEnv._load([str(broken)])


@requires_bwrap
def test_clotho_eval_runs_swe_instances_from_parquet(
    toys: Path, toy_parquet: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "HOME": str(tmp_path), "COLUMNS": "200"}  # a cache of its own
    result = subprocess.run(
        [sys.executable, "-m", "clotho", "eval", str(toy_parquet), "--agent", "oracle",
         "--repos-dir", str(toys), "--filter", "stackq.*", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    stackq = [r["instance_id"] for r in toy_records() if r["instance_id"].startswith("stackq")]
    assert sorted(r["task"] for r in records) == sorted(stackq)
    assert all(r["reward"] == 1.0 and r["error"] is None for r in records)


def test_tb2_rows_from_parquet_and_mapped_columns(tmp_path: Path) -> None:
    rows = [row("alpha"), row("beta"), {"task_name": "gamma"}]
    path = write_parquet(tmp_path / "tb2.parquet", rows)
    tasks, errors = discover_tasks([path], rows_cache=tmp_path / "cache")
    assert sorted(t.name for t in tasks) == ["alpha", "beta"]
    ((name, error),) = errors
    assert name.name == "tb2-row3" and "tb2.parquet[2]: instruction: Field required" in str(error)
    # Columns named otherwise, through a source with a field mapping.
    renamed = [{"name": r.pop("task_name"), "prompt": r.pop("instruction"), **r} for r in rows[:2]]
    mapped = write_parquet(tmp_path / "renamed.parquet", renamed)
    source = DatasetSource(path=str(mapped), fields={"task_name": "name", "instruction": "prompt"})
    tasks, errors = discover_harbor([source], rows_cache=tmp_path / "cache")
    assert not errors and sorted(t.name for t in tasks) == ["alpha", "beta"]
    assert tasks[0].instruction == "Leave /app/data.txt alone."


@pytest.mark.bwrap
def test_clotho_eval_runs_rows_from_parquet(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "tb2.parquet", [row("one"), row("two")])
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "clotho", "eval", str(path), "--agent", "nop", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert {r["task"]: r["reward"] for r in results} == {"one": 1.0, "two": 1.0}


# -- Hugging Face datasets -----------------------------------------------------------------

needs_datasets = pytest.mark.skipif(
    importlib.util.find_spec("datasets") is None,
    reason="the `datasets` extra is not installed (make test installs it)",
)


@needs_datasets
def test_a_dataset_folder_is_read_by_datasets(tmp_path: Path) -> None:
    folder = tmp_path / "qa"
    folder.mkdir()
    qa = [{"question": f"{i}+{i}?", "answer": str(2 * i)} for i in range(10)]
    write_parquet(folder / "train.parquet", qa[:6])
    write_parquet(folder / "test.parquet", qa[6:])
    cache = str(tmp_path / "hf-cache")
    for streaming in (False, True):
        source = DatasetSource(
            hub=str(folder), split="test", cache_dir=cache, streaming=streaming,
            fields={"prompt_field": "question"}, limit=3,
        )  # fmt: skip
        records = list(read_records(source))
        assert good(records) == [{"answer": str(2 * i), "prompt": f"{i}+{i}?"} for i in (6, 7, 8)]
        assert records[0].where == f"hf:{folder}@test[0]"
    with pytest.raises(ConfigError, match="the splits test, train: choose one with `split`"):
        list(read_records(DatasetSource(hub=str(folder), cache_dir=cache)))
    with pytest.raises(ConfigError, match=r"cannot load the dataset: .*nosuch"):
        list(read_records(DatasetSource(hub=str(folder), split="nosuch", cache_dir=cache)))


def hub_cache(cache: Path, repo_id: str, split: str, records: list[dict[str, Any]]) -> None:
    """A Hub dataset in the `datasets` cache as if it had been downloaded: prepared by the
    Parquet builder `datasets` itself uses, under the folder `datasets` gives `repo_id`."""
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.parquet.parquet import Parquet

    owner, name = repo_id.split("/")
    source = write_parquet(cache.parent / f"{name}-{split}.parquet", records)
    builder = Parquet(
        cache_dir=str(cache), dataset_name=name, hash="local", config_id="default",
        data_files=DataFilesDict.from_patterns({split: [str(source)]}),
    )  # fmt: skip
    builder.download_and_prepare()
    (cache / name).rename(cache / f"{owner}___{name}")


OFFLINE_READ = """
import json, sys
from clotho.data import HubUnreachable, read_records
from clotho.swe.instance import load_instances
for spec in sys.argv[1:]:
    try:
        if "instances" in spec:
            found, errors = load_instances(spec)
            print(json.dumps({"instances": [i.instance_id for i in found], "errors": len(errors)}))
        else:
            print(json.dumps({"rows": [r.data for r in read_records(spec)]}))
    except HubUnreachable as exc:
        print(json.dumps({"unreachable": str(exc)}))
"""


@needs_datasets
def test_offline_mode_reads_the_cache_and_says_what_is_missing(tmp_path: Path) -> None:
    cache = tmp_path / "hf-cache"
    hub_cache(cache, "acme/toy-qa", "test", [{"question": "1+1?", "answer": "2"}])
    hub_cache(cache, "acme/toy-instances", "test", toy_records())
    specs = [
        f"hf:acme/toy-qa?split=test&cache_dir={cache}&prompt_field=question",
        f"hf:acme/toy-qa?split=test&cache_dir={cache}&streaming=true",
        f"hf:acme/toy-instances?split=test&cache_dir={cache}",
        f"hf:acme/not-cached?split=test&cache_dir={cache}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", OFFLINE_READ, *specs],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    mapped, streamed, instances, missing = (json.loads(x) for x in proc.stdout.splitlines())
    assert mapped == {"rows": [{"answer": "2", "prompt": "1+1?"}]}
    assert streamed == {"rows": [{"question": "1+1?", "answer": "2"}]}
    assert instances == {"instances": [r["instance_id"] for r in toy_records()], "errors": 0}
    message = missing["unreachable"]
    assert "hf:acme/not-cached@test: not in the local datasets cache" in message
    assert str(cache) in message and "offline mode is on (HF_HUB_OFFLINE" in message


class UnreachableHub:
    """Test double for `datasets.load_dataset` when the Hub cannot be reached (none is
    reachable here, and the real attempt retries for half a minute): it raises what
    `datasets` raises then, a ConnectionError naming the dataset."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, path: str, **kwargs: Any) -> Any:
        self.calls.append((path, kwargs))
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")


@needs_datasets
def test_an_unreachable_hub_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    import datasets

    hub = UnreachableHub()
    monkeypatch.setattr(datasets, "load_dataset", hub)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    source = DatasetSource.parse(f"hf:princeton-nlp/SWE-bench_Lite?split=test&cache_dir={tmp_path}")
    with pytest.raises(HubUnreachable) as caught:
        list(read_records(source))
    message = str(caught.value)
    assert message.startswith("hf:princeton-nlp/SWE-bench_Lite@test: cannot reach the Hugging")
    assert "LocalEntryNotFoundError" in message and str(tmp_path) in message
    assert "set HF_HUB_OFFLINE=1" in message
    assert hub.calls == [
        (
            "princeton-nlp/SWE-bench_Lite",
            {"name": None, "split": "test", "revision": None, "streaming": False,
             "cache_dir": str(tmp_path)},
        )
    ]  # fmt: skip
    # `clotho eval` and the environments stop with it: no run of invalid records.
    with pytest.raises(HubUnreachable):
        discover([Path(f"hf:princeton-nlp/SWE-bench_Lite?split=test&cache_dir={tmp_path}")])
    assert isinstance(caught.value, ConfigError)


def test_without_datasets_a_hub_source_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now fails
    with pytest.raises(ConfigError, match=r"pip install 'clotho-rl\[datasets\]'"):
        list(read_records("hf:a/b?split=test"))


@needs_datasets
def test_discover_reads_instances_and_rows_from_datasets(tmp_path: Path) -> None:
    instances = tmp_path / "instances"
    instances.mkdir()
    write_parquet(instances / "test.parquet", [*toy_records()[:3], {"instance_id": "broken"}])
    rows = tmp_path / "rows"
    rows.mkdir()
    write_parquet(rows / "test.parquet", [row("alpha"), row("beta")])
    other = tmp_path / "other"
    other.mkdir()
    write_parquet(other / "test.parquet", [{"q": 1}])
    cache = tmp_path / "hf-cache"
    paths = [Path(f"hf:{p}?cache_dir={cache}") for p in (instances, rows, other)]
    tasks, errors = discover(paths, rows_cache=tmp_path / "rows-cache")
    swe = [t.name for t in tasks if isinstance(t, SweTrial)]
    assert swe == [r["instance_id"] for r in toy_records()[:3]]
    assert sorted(t.name for t in tasks if not isinstance(t, SweTrial)) == ["alpha", "beta"]
    messages = {p.name: str(e) for p, e in errors}
    assert "base_commit" in messages["broken"]
    (other_error,) = [m for m in messages.values() if "neither SWE instances" in m]
    assert "its first record has q: map columns with `fields`" in other_error


def test_record_errors_are_task_errors() -> None:
    record = Record.failed("x.jsonl:1", 1, "not valid JSON")
    assert isinstance(record.error, TaskError) and record.error.kind == "task"
    assert not record.ok and not record.whole_source
