"""Where trajectories for an SFT export come from: an eval run directory, a groups file
(`clotho process` output, upstream Atropos group files), or live rollouts of an environment.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from clotho.chat.ledger import TokenSequence
from clotho.env.scored import ScoredGroup
from clotho.errors import ConfigError, describe_validation_error
from clotho.export.sft import PASS_REWARD, Trajectory
from clotho.rollout import RolloutOutcome
from clotho.runs import files
from clotho.runs.records import EvalConfig, TrialDetail
from clotho.runs.store import RunStore
from clotho.tools.builtin import default_registry
from clotho.tools.tool import Tool


def tool_schemas(tools: Sequence[Tool]) -> list[dict[str, Any]] | None:
    return [t.schema() for t in tools] or None


def trajectory_of_outcome(
    outcome: RolloutOutcome,
    tools: list[dict[str, Any]] | None,
    *,
    source: str,
    task: str | None = None,
    attempt: int | None = None,
) -> Trajectory:
    result = outcome.agent
    return Trajectory(
        messages=result.messages if result else [],
        tools=tools,
        reward=outcome.reward,
        passed=outcome.passed,
        error=outcome.error,
        sequences=result.sequences if result else None,
        source=source,
        task=task,
        attempt=attempt,
    )


# -- eval run directories ------------------------------------------------------------------


def _run_tools(run_dir: Path) -> list[dict[str, Any]] | None:
    """The tool schemas the run's agent was given (none for `nop`)."""
    path = run_dir / "config.json"
    try:
        config = EvalConfig.model_validate_json(files.read_file(run_dir, "config.json"))
    except OSError as exc:
        raise ConfigError(
            f"{run_dir} is not an eval run directory (no config.json): {exc}"
        ) from exc
    except ValidationError as exc:
        raise ConfigError(f"{path}: {describe_validation_error(exc)}") from exc
    if config.agent == "nop":
        return None
    # The schemas only: a toolset whose provider is gone since the run still exports.
    registry = default_registry(config.tools)
    names = dict.fromkeys(n for name in config.toolsets for n in registry.toolset_tools(name))
    return tool_schemas([registry.tools[n] for n in names])


def trajectories_from_run(run_dir: Path) -> Iterator[Trajectory]:
    """Every finished attempt of an eval run, from results.jsonl and its trial files.

    Read at the end of a run (or any time later), so a resumed run's file is complete: an
    attempt that ran again has one line in results.jsonl, its latest. A detail path that
    leads outside the run's trials folder (a hand-edited or hostile results file, a linked
    `trials/`) is refused, and so is anything but a regular file (a FIFO is never waited on).
    """
    tools = _run_tools(run_dir)
    for record in RunStore(run_dir).load_records():
        if record.detail is None:
            continue
        path = run_dir / record.detail
        parts = PurePosixPath(record.detail).parts
        if len(parts) < 2 or parts[0] != "trials" or ".." in parts:
            raise ConfigError(f"{run_dir}: trial file {record.detail!r} is outside trials/")
        try:
            detail = TrialDetail.model_validate_json(files.read_file(run_dir, record.detail))
        except OSError as exc:
            raise ConfigError(f"cannot read trial file {path}: {exc}") from exc
        except ValidationError as exc:
            raise ConfigError(f"{path}: {describe_validation_error(exc)}") from exc
        result = detail.agent_result
        yield Trajectory(
            messages=result.messages if result else [],
            tools=tools,
            reward=record.reward,
            passed=record.passed,
            error=record.error,
            sequences=result.sequences if result else None,
            source="eval",
            task=record.task,
            attempt=record.attempt,
        )


# -- groups files ----------------------------------------------------------------------------


def trajectories_of_group(group: ScoredGroup, index: int) -> Iterator[Trajectory]:
    """A group's rows as trajectories. Neighbouring rows with the same messages and different
    tokens are one rollout whose chat template split it (`Environment.score_group` writes
    them so); they become one trajectory with several sequences. A row passes when its
    score reaches 1.0, the rollouts' default pass threshold. Tools are not in a group."""
    messages = group.messages or []
    if len(messages) != group.size:  # tokens only (messages are optional on the wire)
        for score in group.scores:
            yield Trajectory(messages=[], reward=score, passed=score >= PASS_REWARD,
                             source="groups", task=f"group {index}")  # fmt: skip
        return
    rows: list[tuple[list[dict[str, Any]], float, list[TokenSequence]]] = []
    for conversation, tokens, masks, score in zip(
        messages, group.tokens, group.masks, group.scores, strict=True
    ):
        sequence = TokenSequence(tokens=tokens, masks=masks)
        if rows and rows[-1][0] == conversation and rows[-1][2][-1].tokens != tokens:
            rows[-1][2].append(sequence)
        else:
            rows.append((conversation, score, [sequence]))
    for conversation, score, sequences in rows:
        yield Trajectory(
            messages=conversation,
            reward=score,
            passed=score >= PASS_REWARD,
            sequences=[s for s in sequences if s.tokens] or None,
            sequences_from="group",
            source="groups",
            task=f"group {index}",
        )


def trajectories_from_groups(path: Path) -> Iterator[Trajectory]:
    from clotho.trainers.jsonl import load_groups

    for index, group in enumerate(load_groups(path)):
        yield from trajectories_of_group(group, index)


def trajectories_from(source: Path) -> Iterator[Trajectory]:
    """A run directory or a groups JSONL file."""
    if source.is_dir():
        return trajectories_from_run(source)
    if source.is_file():
        return trajectories_from_groups(source)
    raise ConfigError(f"{source} is neither an eval run directory nor a groups JSONL file")


# -- live rollouts ---------------------------------------------------------------------------


def item_name(item: Any) -> str | None:
    """An item's name for the metadata, when it has one."""
    for attr in ("name", "instance_id", "id"):
        value = getattr(item, attr, None)
        if isinstance(value, str | int):
            return str(value)
    if isinstance(item, dict):
        value = item.get("name") or item.get("id")
        return str(value) if value is not None else None
    return None


__all__ = [
    "item_name",
    "tool_schemas",
    "trajectories_from",
    "trajectories_from_groups",
    "trajectories_from_run",
    "trajectory_of_outcome",
]
