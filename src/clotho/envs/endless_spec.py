"""What a task generator is asked for, and how its reply is read.

The generator is a model, so its reply is untrusted text: it may be garbled, wrapped in
prose or code fences, or hostile (file names that climb out of the workspace, scripts of
megabytes). `parse_reply` turns it into a `GeneratedTask` or raises `Rejected` with a short
reason that the environment counts; it never raises anything else.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from clotho.errors import describe_validation_error
from clotho.tasks.environment import BUILD_FILES


class Rejected(Exception):
    """A generated task that is not kept; `reason` is the counter it goes to."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class GenerationLimits(BaseModel):
    """How big a generated task may be: far above a real terminal task, far below harm."""

    model_config = ConfigDict(extra="forbid")

    max_reply_chars: int = Field(400_000, ge=1)
    max_instruction_chars: int = Field(16_000, ge=1)
    max_script_bytes: int = Field(64 << 10, ge=1, description="each of setup, tests, solution")
    max_files: int = Field(64, ge=0)
    max_file_bytes: int = Field(256 << 10, ge=1)
    max_total_file_bytes: int = Field(1 << 20, ge=1)
    max_path_chars: int = Field(200, ge=1)


SYSTEM_PROMPT = """\
You invent small, self-contained Linux terminal tasks for training command-line agents.
Each task runs in a sandbox with no network, working directory /app, with bash, coreutils,
grep, sed, awk, find, tar, git, sqlite3, jq, perl and python3 (standard library only).

Reply with ONE JSON object and nothing else, with these keys:
  "name":        short kebab-case name, e.g. "rotate-log-files"
  "category":    e.g. "files", "text-processing", "git", "data", "system-administration"
  "difficulty":  "easy", "medium" or "hard"
  "instruction": what the agent is told (markdown); name exact paths under /app and the
                 exact expected output format
  "files":       object mapping relative paths under /app to their text content (the
                 initial state; may be empty)
  "setup":       bash script run in /app after the files are written, to finish the
                 initial state (may be empty); everything it leaves must be under /app
  "tests":       bash script run in /app after the agent finished: exit 0 if and only if
                 the final state is correct; it must FAIL on the initial state
  "solution":    bash script run in /app that solves the task; the tests must pass after it

The agent never sees "tests" or "solution". Keep everything deterministic.
"""

USER_PROMPT = "Write a new task{topic}. Reply with the JSON object only."

_NAME_CHARS = re.compile(r"[^a-z0-9]+")
_THINK_END = "</think>"
_FENCE = "```"
MAX_DECODE_ATTEMPTS = 64  # JSON decodes tried per reply: each may scan the whole reply


def slug(name: str) -> str:
    """A task folder name from whatever the generator called it (never a path)."""
    text = _NAME_CHARS.sub("-", name.lower()).strip("-")[:48].strip("-")
    return text or "task"


def check_relative_path(path: str, max_chars: int) -> str:
    """A workspace file name: relative, inside /app, no `..`, no NUL, no control characters."""
    if not path or len(path) > max_chars:
        raise ValueError(f"file name {path[:80]!r}: must have 1 to {max_chars} characters")
    if any(ord(c) < 32 or c == "\x7f" for c in path) or "\\" in path:
        raise ValueError(f"file name {path[:80]!r}: control characters or backslashes")
    if path.startswith("/"):
        raise ValueError(f"file name {path[:80]!r}: absolute; give a path relative to /app")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"file name {path[:80]!r}: empty, '.' or '..' components")
    if posixpath.normpath(path) != path:
        raise ValueError(f"file name {path[:80]!r}: not a normal path")
    if path in BUILD_FILES:  # environment/Dockerfile would make a container backend build it
        raise ValueError(f"file name {path!r}: a container build file, not workspace content")
    return path


class GeneratedTask(BaseModel):
    """One task as the generator described it (validated, not yet checked for soundness)."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=False)

    name: str = Field(min_length=1, max_length=200)
    category: str = Field("generated", max_length=100)
    difficulty: str = Field("medium", max_length=40)
    instruction: str = Field(min_length=1)
    files: dict[str, str] = Field(default_factory=dict)
    setup: str = ""
    tests: str = Field(min_length=1)
    solution: str = Field(min_length=1)

    @field_validator("instruction", "tests", "solution")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    def check_limits(self, limits: GenerationLimits) -> None:
        """Sizes and file names; a `Rejected('invalid', ...)` names the first problem."""
        problems: list[str] = []
        if len(self.instruction) > limits.max_instruction_chars:
            problems.append(f"instruction longer than {limits.max_instruction_chars} characters")
        for key in ("setup", "tests", "solution"):
            text: str = getattr(self, key)
            if "\0" in text:
                problems.append(f"{key} contains a NUL character")
            if len(text.encode()) > limits.max_script_bytes:
                problems.append(f"{key} larger than {limits.max_script_bytes} bytes")
        if len(self.files) > limits.max_files:
            problems.append(f"{len(self.files)} files (at most {limits.max_files})")
        total = 0
        seen: dict[str, str] = {}
        for path, content in self.files.items():
            try:
                check_relative_path(path, limits.max_path_chars)
            except ValueError as exc:
                problems.append(str(exc))
                continue
            size = len(content.encode())
            total += size
            if size > limits.max_file_bytes:
                problems.append(f"file {path!r} larger than {limits.max_file_bytes} bytes")
            if "\0" in content:
                problems.append(f"file {path!r} contains a NUL character")
            # a/b and a (as a file) cannot both exist; nor may two names differ only in case
            # (they would collide on a case-insensitive host)
            prefix = posixpath.dirname(path)
            while prefix:
                if prefix in self.files:
                    problems.append(f"{prefix!r} is both a file and a folder")
                prefix = posixpath.dirname(prefix)
            if path.lower() in seen:
                problems.append(f"{path!r} and {seen[path.lower()]!r} differ only in case")
            seen[path.lower()] = path
        if total > limits.max_total_file_bytes:
            problems.append(f"files total {total} bytes (at most {limits.max_total_file_bytes})")
        if problems:
            raise Rejected("invalid", "; ".join(problems[:5]))


def after_thinking(text: str) -> str:
    """The reply after its last `</think>` (all of it when there is none): one scan."""
    end = text.rfind(_THINK_END)
    return text if end == -1 else text[end + len(_THINK_END) :]


def fenced_blocks(text: str) -> list[str]:
    """The bodies of ``` fences (an optional `json` tag, then a line break; closed by a line
    break and ```), in order. Each search starts where the last one ended: linear in the
    reply, whatever it holds (a regex with a lazy body rescans for every opening)."""
    blocks: list[str] = []
    pos = 0
    n = len(text)
    while True:
        opening = text.find(_FENCE, pos)
        if opening == -1:
            return blocks
        start = opening + len(_FENCE)
        if text.startswith("json", start):
            start += 4
        end_ws = start
        while end_ws < n and text[end_ws].isspace():
            end_ws += 1
        newline = text.rfind("\n", start, end_ws)
        if newline == -1:  # not an opening fence: look on after it
            pos = end_ws if end_ws > start else start
            continue
        body = newline + 1
        closing = text.find("\n" + _FENCE, body)
        if closing == -1:  # no closing fence anywhere after: none of the later ones closes
            return blocks
        blocks.append(text[body:closing])
        pos = closing + 1 + len(_FENCE)


def _json_objects(text: str) -> list[Any]:
    """The first JSON object that starts somewhere in `text` (fenced blocks first), after at
    most `MAX_DECODE_ATTEMPTS` decodes: a reply of `{"":` repeated would otherwise be decoded
    from each of its hundred thousand braces."""
    decoder = json.JSONDecoder()
    attempts = 0
    for candidate in [*fenced_blocks(text), text]:
        start = candidate.find("{")
        while start != -1:
            if attempts >= MAX_DECODE_ATTEMPTS:
                return []
            attempts += 1
            try:
                value, _ = decoder.raw_decode(candidate, start)
            except (ValueError, RecursionError):
                start = candidate.find("{", start + 1)
                continue
            if isinstance(value, dict):
                return [value]
            start = candidate.find("{", start + 1)
    return []


def parse_reply(text: str, limits: GenerationLimits) -> GeneratedTask:
    """The task in a generator's reply, or `Rejected` ('unparseable' or 'invalid')."""
    if len(text) > limits.max_reply_chars:
        raise Rejected("invalid", f"reply of {len(text)} characters")
    text = after_thinking(text)
    objects = _json_objects(text)
    if not objects:
        raise Rejected("unparseable", f"no JSON object in the reply: {text[:200]!r}")
    data = objects[0]
    if isinstance(data.get("files"), list):  # [{"path": ..., "content": ...}] is read too
        try:
            data["files"] = {str(f["path"]): f["content"] for f in data["files"]}
        except (KeyError, TypeError) as exc:
            raise Rejected("invalid", f"files: entries need path and content ({exc})") from exc
    try:
        task = GeneratedTask.model_validate(data)
    except ValidationError as exc:
        raise Rejected("invalid", describe_validation_error(exc)) from exc
    task.check_limits(limits)
    return task
