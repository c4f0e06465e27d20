"""File tools. They read and write through the sandbox's file API, so bytes are exact."""

from __future__ import annotations

import difflib
import re
import shlex
from typing import Literal

from clotho.tools.runtime import ToolFailure, ToolRuntime, truncate_middle
from clotho.tools.tool import tool

_MAX_LINE = 2000


async def _read_bytes(rt: ToolRuntime, path: str) -> bytes:
    try:
        return await rt.sandbox.read_file(path)
    except FileNotFoundError as exc:
        raise ToolFailure(f"file not found: {path}") from exc
    except IsADirectoryError as exc:
        raise ToolFailure(f"{path} is a directory; use search_files or terminal `ls`") from exc


def _as_text(data: bytes, path: str) -> str:
    if b"\x00" in data[:8192]:
        raise ToolFailure(
            f"{path} is a binary file ({len(data)} bytes); inspect it with terminal tools"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolFailure(f"{path} is not UTF-8 text: {exc}") from exc


def _lines_keepends(text: str) -> list[str]:
    """Lines with their ends, split at newlines only (str.splitlines also splits at form
    feeds, lone carriage returns, U+2028...)."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


@tool
async def read_file(rt: ToolRuntime, path: str, offset: int = 1, limit: int = 500) -> str:
    """Read a text file, with line numbers.

    Args:
        path: file path (relative paths start at the working directory).
        offset: first line to show, counting from 1.
        limit: how many lines to show at most.
    """
    if offset < 1 or limit < 1:
        raise ToolFailure("offset and limit must be at least 1")
    text = _as_text(await _read_bytes(rt, path), path)
    # Only "\n" ends a line (as for grep -n and sed), not str.splitlines()'s \f, \r, U+2028...
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines[-1] == "":
        lines.pop()
    if not lines:
        return f"{path} is empty"
    if offset > len(lines):
        raise ToolFailure(f"offset {offset} is past the end of {path} ({len(lines)} lines)")
    chosen = lines[offset - 1 : offset - 1 + limit]
    out = []
    for number, line in enumerate(chosen, start=offset):
        if len(line) > _MAX_LINE:
            line = line[:_MAX_LINE] + f" [... {len(line) - _MAX_LINE} more characters]"
        out.append(f"{number:6d}\t{line}")
    last = offset + len(chosen) - 1
    if last < len(lines):
        out.append(f"[lines {offset}-{last} of {len(lines)}; use offset={last + 1} to read on]")
    return truncate_middle("\n".join(out), rt.max_output_chars)


@tool(parallel=False)
async def write_file(rt: ToolRuntime, path: str, content: str) -> str:
    """Create or overwrite a file with the given content (parent directories are created).

    Args:
        path: file path (relative paths start at the working directory).
        content: the complete new content of the file.
    """
    data = content.encode("utf-8")
    try:
        await rt.sandbox.write_file(path, data)
    except IsADirectoryError as exc:
        raise ToolFailure(f"{path} is a directory") from exc
    return f"wrote {len(data)} bytes to {rt.sandbox.resolve(path)}"


@tool(parallel=False)
async def edit_file(
    rt: ToolRuntime, path: str, old_string: str, new_string: str, replace_all: bool = False
) -> str:
    """Replace exact text in a file and return the unified diff of the change.

    `old_string` must occur exactly once unless `replace_all` is true; include enough
    surrounding lines to make it unique.

    Args:
        path: file path (relative paths start at the working directory).
        old_string: the exact text to find, including whitespace and indentation.
        new_string: the replacement text.
        replace_all: replace every occurrence instead of exactly one.
    """
    if not old_string:
        raise ToolFailure("old_string must not be empty; use write_file to create a file")
    if old_string == new_string:
        raise ToolFailure("old_string and new_string are the same")
    before = _as_text(await _read_bytes(rt, path), path)
    count = before.count(old_string)
    if count == 0:
        raise ToolFailure(f"old_string was not found in {path}")
    if count > 1 and not replace_all:
        raise ToolFailure(
            f"old_string occurs {count} times in {path}; add context to make it unique "
            "or set replace_all"
        )
    after = before.replace(old_string, new_string)
    await rt.sandbox.write_file(path, after.encode("utf-8"))
    diff = difflib.unified_diff(
        _lines_keepends(before),
        _lines_keepends(after),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    # difflib leaves a last line without "\n" glued to the next one; mark it like diff(1) does.
    text = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff
    )
    return truncate_middle(text, rt.max_output_chars)


@tool
async def search_files(
    rt: ToolRuntime,
    pattern: str,
    path: str = ".",
    mode: Literal["content", "files"] = "content",
    glob: str | None = None,
    limit: int = 100,
) -> str:
    """Search file contents with a regular expression, or find files by name.

    Args:
        pattern: in `content` mode an extended regular expression; in `files` mode a file-name glob such as `*.py`.
        path: directory (or file) to search.
        mode: `content` to grep inside files, `files` to list matching file names.
        glob: in `content` mode, only search files whose name matches this glob.
        limit: maximum number of lines to return.
    """
    if limit < 1:
        raise ToolFailure("limit must be at least 1")
    where = shlex.quote(path)
    if mode == "content":
        include = f"--include={shlex.quote(glob)} " if glob else ""
        cmd = (
            f"grep -rnIE --color=never --exclude-dir=.git {include}"
            f"-e {shlex.quote(pattern)} -- {where}"
        )
    else:
        cmd = f"find {where} -name .git -prune -o -type f -name {shlex.quote(pattern)} -print"
    # A subshell: `exit` must not end the session shell, which holds the agent's exports.
    result = await rt.sandbox.exec(f"( {cmd} | head -n {limit + 1}; exit ${{PIPESTATUS[0]}} )")
    if result.exit_code not in (0, 1) and not result.stdout:
        raise ToolFailure(f"search failed: {result.stderr.strip() or result.exit_code}")
    lines = result.stdout.splitlines()
    if not lines:
        return "no matches"
    note = ""
    if len(lines) > limit:
        lines = lines[:limit]
        note = f"\n[more than {limit} matches; narrow the search or raise limit]"
    return truncate_middle("\n".join(lines), rt.max_output_chars) + note
