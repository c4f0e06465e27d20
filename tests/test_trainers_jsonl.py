"""The JSONL sink and loader, and the scored-group model's own checks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from tests.test_trainers_support import BATCH_KEYS, make_group

from clotho.env.scored import ScoredGroup
from clotho.errors import ConfigError
from clotho.trainers import JsonlSink, TrajectorySink, load_groups
from clotho.trainers.protocol import to_wire


async def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "out" / "groups.jsonl"
    sink: TrajectorySink = JsonlSink(path, env_id=3)
    groups = [make_group(4, marker=1), make_group(2, marker=2)]
    assert await sink.send_groups(groups) == 2
    assert await sink.send_groups([make_group(4, marker=3).model_dump()]) == 1
    await sink.wait_for_room()  # a file is never full
    await sink.send(make_group(2, marker=4))
    await sink.aclose()

    lines = path.read_text().splitlines()
    assert len(lines) == 4
    first = json.loads(lines[0])
    assert first["schema_version"] == 1 and set(first) == BATCH_KEYS | {"schema_version"}

    loaded = load_groups(path)
    assert [g.tokens[0][0] for g in loaded] == [1, 2, 3, 4]
    assert all(g.env_id == 3 for g in loaded)
    assert all(isinstance(g, ScoredGroup) for g in loaded)
    assert loaded[0].model_dump(exclude={"env_id"}) == groups[0].model_dump(exclude={"env_id"})
    assert groups[0].env_id is None  # the sink filled in its copy, not the caller's group
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
        ScoredGroup(tokens=[[1], [2], [3]], masks=[[1], [2]], scores=[0, 0, 0])
    with pytest.raises(ValidationError, match="sequence 0: 2 tokens but 1 masks"):
        ScoredGroup(tokens=[[1, 2]], masks=[[1]], scores=[0])
    with pytest.raises(ValidationError, match="inference_logprobs has 2 entries for 1"):
        ScoredGroup(tokens=[[1]], masks=[[1]], scores=[0], inference_logprobs=[[0.0], [0.0]])
    with pytest.raises(ValidationError, match="at least one sequence"):
        ScoredGroup(tokens=[], masks=[], scores=[])
    with pytest.raises(ValidationError, match="'role' and 'content'"):
        ScoredGroup(tokens=[[1]], masks=[[1]], scores=[0], messages=[[{"role": "user"}]])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinite_floats_are_refused_anywhere_in_a_group(bad: float) -> None:
    # JSON has no NaN: such a score reached trainers as null.
    with pytest.raises(ValidationError, match="finite number"):
        ScoredGroup(tokens=[[1]], masks=[[1]], scores=[bad])
    with pytest.raises(ValidationError, match="finite number"):
        ScoredGroup(tokens=[[1]], masks=[[1]], scores=[0], inference_logprobs=[[bad]])
    text = '{"tokens": [[1]], "masks": [[1]], "scores": [NaN]}'
    with pytest.raises(ValidationError, match="finite number"):
        ScoredGroup.model_validate_json(text)


def test_token_ids_must_be_in_the_vocabulary_when_it_is_known() -> None:
    with pytest.raises(ValidationError, match="token id -3 is negative"):
        ScoredGroup(tokens=[[1, -3]], masks=[[-100, -3]], scores=[0])
    group = {"tokens": [[5, 99]], "masks": [[-100, 99]], "scores": [1.0]}
    assert ScoredGroup.model_validate(group).size == 1  # vocabulary unknown: any id >= 0
    assert ScoredGroup.model_validate(group, context={"vocab_size": 100}).size == 1
    with pytest.raises(ValidationError, match=r"token id 99 is outside the vocabulary \(size 99\)"):
        ScoredGroup.model_validate(group, context={"vocab_size": 99})
    masked = {"tokens": [[5, 9]], "masks": [[-100, 120]], "scores": [1.0]}
    with pytest.raises(ValidationError, match="token id 120"):
        ScoredGroup.model_validate(masked, context={"vocab_size": 100})


def test_to_wire_fills_env_id_and_dumps_all_fourteen_keys() -> None:
    group = make_group(2)
    assert to_wire(group, None) is group
    wire = to_wire(group, 5)
    assert isinstance(wire, ScoredGroup) and wire.env_id == 5 and group.env_id is None
    assert set(json.loads(wire.wire_json())) == BATCH_KEYS == set(wire.wire())
    assert json.loads(wire.model_dump_json())["schema_version"] == 1  # files carry it
    assert to_wire(wire, None).env_id == 5
    assert to_wire(group.model_dump(), 7).env_id == 7
    with pytest.raises(ValidationError):
        to_wire({"tokens": [[1]], "masks": [], "scores": [1.0]}, 1)
