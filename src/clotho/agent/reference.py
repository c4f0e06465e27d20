"""Reference agents for checking tasks: `oracle` runs the task's solution, `nop` does nothing.

They produce an `AgentResult` like a model agent does, so the same trial path (sandbox,
verifier, results) checks them.
"""

from __future__ import annotations

import json
import time

from clotho.agent.base import AgentContext
from clotho.agent.result import AgentResult
from clotho.errors import TaskError
from clotho.tools.runtime import truncate_middle


class NopAgent:
    name = "nop"

    async def run(self, ctx: AgentContext) -> AgentResult:
        return AgentResult(messages=[{"role": "user", "content": ctx.instruction}])


class OracleAgent:
    name = "oracle"

    async def run(self, ctx: AgentContext) -> AgentResult:
        if ctx.solution_dir is None or not (ctx.solution_dir / "solve.sh").is_file():
            raise TaskError("the oracle needs solution/solve.sh, and this task has none")
        started = time.perf_counter()
        await ctx.sandbox.upload(ctx.solution_dir, ctx.solution_mount)
        command = f"bash {ctx.solution_mount}/solve.sh"
        result = await ctx.sandbox.exec(f"exec 2>&1\n{command}", timeout=ctx.time_limit_s)
        output = json.dumps(
            {
                "output": truncate_middle(result.stdout + result.stderr, 16_000),
                "exit_code": result.exit_code,
                "timed_out": result.timed_out,
            }
        )
        call = {
            "id": "oracle_0",
            "type": "function",
            "function": {"name": "terminal", "arguments": json.dumps({"command": command})},
        }
        messages = [
            {"role": "user", "content": ctx.instruction},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "oracle_0", "content": output},
        ]
        return AgentResult(
            messages=messages,
            turns=1,
            tool_calls=1,
            stop_reason="time_limit" if result.timed_out else "finished",
            duration_s=time.perf_counter() - started,
        )
