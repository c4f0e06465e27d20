"""The JSONL sink and loader, and the wire models' own checks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from tests.test_trainers_support import BATCH_KEYS, make_group

from clotho.errors import ConfigError
from clotho.trainers import JsonlSink, ScoredData, ScoredDataGroup, TrajectorySink, load_groups
from clotho.trainers.protocol import to_wire


async def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "out" / "groups.jsonl"
    sink: TrajectorySink = JsonlSink(path, env_id=3)
    groups = [make_group(4, marker=1), make_group(2, marker=2)]
    assert await sink.send_groups(groups) == 2
    assert await sink.send_groups([make_group(4, marker=3).model_dump()]) == 1
    await sink.aclose()

    lines = path.read_text().splitlines()
    assert len(lines) == 3
    first = json.loads(lines[0])
    assert first["schema_version"] == 1 and set(first) == BATCH_KEYS | {"schema_version"}

    loaded = load_groups(path)
    assert [g.tokens[0][0] for g in loaded] == [1, 2, 3]
    assert all(g.env_id == 3 for g in loaded)
    assert loaded[0].model_dump(exclude={"schema_version", "env_id"}) == groups[0].model_dump()
    assert loaded[1].size == 2


async def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    sink = JsonlSink(path)
    # Lines above 1 MiB are written from a thread: concurrent calls must still not interleave.
    groups = [make_group(2, marker=m, completion_len=40_000) for m in range(6)]
    assert len(groups[0].model_dump_json()) > 1 << 20
    await asyncio.gather(*(sink.send_groups([g]) for g in groups))
    assert sorted(g.tokens[0][0] for g in load_groups(path)) == list(range(6))
    assert sink.written == 6


def test_a_line_cut_short_by_a_crash_is_skipped_other_damage_is_not(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    good = make_group(2).model_dump_json()
    path.write_text(good + "\n" + good[: len(good) // 2])
    assert len(load_groups(path)) == 1
    path.write_text(good[: len(good) // 2] + "\n" + good + "\n")
    with pytest.raises(ConfigError, match=r"g.jsonl:1: not JSON"):
        load_groups(path)
    path.write_text('{"tokens": [[1]], "masks": [[1, 2]], "scores": [1]}\n')
    with pytest.raises(ConfigError, match=r":1: not a scored group"):
        load_groups(path)


def test_upstream_lines_load_and_newer_versions_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "g.jsonl"
    upstream = {"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0], "overrides": None}
    path.write_text(json.dumps(upstream) + "\n")
    (line,) = load_groups(path)
    assert line.schema_version == 1 and line.masks == [[-100, 2]]
    path.write_text(json.dumps({**upstream, "schema_version": 2}) + "\n")
    with pytest.raises(ConfigError, match="newer than this clotho"):
        load_groups(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_groups(tmp_path / "missing.jsonl")


def test_group_models_check_alignment() -> None:
    with pytest.raises(ValidationError, match="3 token lists, 2 mask lists"):
        ScoredDataGroup(tokens=[[1], [2], [3]], masks=[[1], [2]], scores=[0, 0, 0])
    with pytest.raises(ValidationError, match="sequence 0: 2 tokens but 1 masks"):
        ScoredDataGroup(tokens=[[1, 2]], masks=[[1]], scores=[0])
    with pytest.raises(ValidationError, match="inference_logprobs has 2 entries for 1"):
        ScoredDataGroup(tokens=[[1]], masks=[[1]], scores=[0], inference_logprobs=[[0.0], [0.0]])
    with pytest.raises(ValidationError, match="at least one sequence"):
        ScoredDataGroup(tokens=[], masks=[], scores=[])
    with pytest.raises(ValidationError, match="'role' and 'content'"):
        ScoredDataGroup(tokens=[[1]], masks=[[1]], scores=[0], messages=[[{"role": "user"}]])


def test_to_wire_fills_env_id_and_dumps_all_fourteen_keys() -> None:
    group = make_group(2)
    wire = to_wire(group, 5)
    assert isinstance(wire, ScoredData) and wire.env_id == 5
    assert set(json.loads(wire.model_dump_json())) == BATCH_KEYS
    assert to_wire(wire, None).env_id == 5
    assert to_wire(group.model_dump(), 7).env_id == 7
    with pytest.raises(ValidationError):
        to_wire({"tokens": [[1]], "masks": [], "scores": [1.0]}, 1)
