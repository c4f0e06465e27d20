"""The `terminal` tool: one shell command in the rollout's sandbox."""

from __future__ import annotations

import json

from clotho.tools.runtime import ToolRuntime, truncate_middle
from clotho.tools.tool import tool


@tool(parallel=False)
async def terminal(
    rt: ToolRuntime, command: str, timeout: int | None = None, workdir: str | None = None
) -> str:
    """Run a bash command in the task's sandbox and return its combined stdout and stderr.

    Calls share one shell session: variables and exports persist, and background
    processes (`cmd &`) keep running. Each call starts in the working directory (or
    `workdir`), so use `cd dir && ...` within one command. Long output is cut in the middle.

    Args:
        command: the bash command line to run.
        timeout: seconds before the command is killed (default 180).
        workdir: directory to run in (default: the task's working directory).
    """
    seconds = timeout if timeout is not None else rt.default_timeout_s
    seconds = max(1.0, min(float(seconds), rt.max_timeout_s))
    result = await rt.sandbox.exec(f"exec 2>&1\n{command}", timeout=seconds, cwd=workdir)
    payload: dict[str, object] = {
        "output": truncate_middle(result.stdout + result.stderr, rt.max_output_chars),
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
    }
    if result.timed_out:
        payload["error"] = f"command timed out after {seconds:g} s and was killed"
    return json.dumps(payload, ensure_ascii=False)
