"""The prompts file of `clotho generate`: one JSON object a line, read and checked whole before
anything runs, so a malformed line is an error naming its line, never a prompt quietly lost.

    {"prompt": "...", "id": "q1", "workdir": "repo/", "verify": "test -f out.txt",
     "image": "fig.png"}

`prompt` is required. Relative `workdir` and `image` paths are the file's folder's. An item
without `id` is named by its content (`p-<sha256 prefix>`), so inserting lines never renames
the others and a resumed run skips exactly what it finished.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clotho.errors import ConfigError, describe_validation_error

MAX_PROMPTS_BYTES = 256 << 20
MAX_IMAGE_BYTES = 20 << 20
"""An image larger than this is not a prompt's picture (and would not fit a request)."""
MAX_ERRORS_SHOWN = 20
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""Ids name files in the run folder: no separators, no case where two ids share a file."""


class PromptLine(BaseModel):
    """One line of the prompts file, as written."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    prompt: str = Field(min_length=1)
    id: str | None = None
    image: str | None = None
    workdir: str | None = None
    verify: str | None = Field(None, min_length=1)


@dataclass(frozen=True)
class PromptItem:
    """A checked prompt: what one rollout of `clotho generate` runs."""

    id: str
    line: int
    prompt: str
    workdir: Path | None = None
    verify: str | None = None
    image: bytes | None = None
    image_path: Path | None = None


def _content_id(line: PromptLine) -> str:
    key = json.dumps(
        [line.prompt, line.image, line.workdir, line.verify], ensure_ascii=False
    ).encode()
    return "p-" + hashlib.sha256(key).hexdigest()[:12]


def in_subshell(command: str) -> str:
    """The command as the verifier's test.sh runs it (`runs/generate.py`): in a subshell, so
    its `exit` ends only it."""
    return f"(\n{command}\n)\n"


def _shell_syntax(command: str) -> str | None:
    """What bash says is wrong with the script's syntax (`bash -n`: nothing runs), or None."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    done = subprocess.run(
        [bash, "-n", "-c", command], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or ["a syntax error"])[-1][:300]


def _check_verify(items: list[PromptItem], path: Path) -> list[str]:
    """The lines whose verify command bash cannot read, as it will run. One `bash -n` of
    them all first (a file of many prompts costs one process), each alone only when that
    fails, to name them."""
    checked = [item for item in items if item.verify is not None]
    if not checked or _shell_syntax("".join(in_subshell(i.verify or "") for i in checked)) is None:
        return []
    problems = []
    for item in checked:
        if (why := _shell_syntax(in_subshell(item.verify or ""))) is not None:
            problems.append(f"{path}:{item.line}: verify: not a shell command bash can read: {why}")
    return problems


def _image(path: Path) -> bytes:
    from clotho.chat.types import image_mime  # type: ignore[attr-defined]

    with path.open("rb") as file:
        data = file.read(MAX_IMAGE_BYTES + 1)
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_IMAGE_BYTES >> 20} MiB")
    if image_mime(data) is None:
        raise ValueError(f"{path} is not a PNG, JPEG, GIF or WebP image")
    return data


def image_support() -> str | None:
    """Why image lines cannot run in this build, or None when they can (the chat types send
    image content parts)."""
    from clotho.chat import types

    if not all(hasattr(types, name) for name in ("image_mime", "image_part")):
        return (
            "this clotho cannot send images to a model yet (clotho.chat.types has no image "
            "content parts); leave `image` out of the prompts"
        )
    return None


def _item(number: int, text: str, base: Path) -> PromptItem:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    try:
        line = PromptLine.model_validate(data)
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc)) from None
    if not line.prompt.strip():
        raise ValueError("prompt: empty")
    if line.id is not None and not ID_PATTERN.fullmatch(line.id):
        raise ValueError(
            f"id {line.id[:80]!r}: letters, digits, '_', '.' and '-', starting with a letter or "
            "digit, at most 128 characters"
        )
    workdir = None
    if line.workdir is not None:
        workdir = (base / line.workdir).expanduser().resolve()
        if not workdir.is_dir():
            raise ValueError(f"workdir {line.workdir!r}: {workdir} is not a folder")
    image = image_path = None
    if line.image is not None:
        why = image_support()
        if why is not None:
            raise ValueError(f"image {line.image!r}: {why}")
        image_path = (base / line.image).expanduser().resolve()
        try:
            image = _image(image_path)
        except OSError as exc:
            raise ValueError(f"image {line.image!r}: cannot read it: {exc.strerror}") from None
        except ValueError as exc:
            raise ValueError(f"image {line.image!r}: {exc}") from None
    return PromptItem(
        id=line.id or _content_id(line),
        line=number,
        prompt=line.prompt,
        workdir=workdir,
        verify=line.verify,
        image=image,
        image_path=image_path,
    )


def read_prompts(path: Path) -> list[PromptItem]:
    """Every item of the file, or a `ConfigError` listing each bad line (`FILE:LINE: why`).
    Blank lines are skipped; ids must be unique (content ids of identical lines get `-2`,
    `-3`...). Blocking (reads files, runs `bash -n`): call it off the event loop."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_PROMPTS_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if len(raw) > MAX_PROMPTS_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_PROMPTS_BYTES >> 20} MiB")
    base = path.resolve().parent
    items: list[PromptItem] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for number, line_bytes in enumerate(raw.split(b"\n"), start=1):
        try:
            text = line_bytes.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            problems.append(f"{path}:{number}: not UTF-8 (byte {exc.start})")
            continue
        if not text.strip():
            continue
        try:
            item = _item(number, text, base)
        except ValueError as exc:
            problems.append(f"{path}:{number}: {exc}")
            continue
        if item.id in seen:
            if item.id.startswith("p-") and not json.loads(text).get("id"):
                n = 2
                while f"{item.id}-{n}" in seen:
                    n += 1
                item = PromptItem(**{**item.__dict__, "id": f"{item.id}-{n}"})
            else:
                problems.append(f"{path}:{number}: id {item.id!r} is line {seen[item.id]}'s too")
                continue
        seen[item.id] = number
        items.append(item)
    problems += _check_verify(items, path)
    if problems:
        problems.sort(key=lambda p: int(p[len(str(path)) + 1 :].split(":", 1)[0]))
        shown = problems[:MAX_ERRORS_SHOWN]
        more = len(problems) - len(shown)
        raise ConfigError(
            f"{len(problems)} malformed line(s) in {path}; nothing ran:\n  "
            + "\n  ".join(shown)
            + (f"\n  ... and {more} more" if more else "")
        )
    if not items:
        raise ConfigError(f"{path}: no prompts in it")
    return items
