"""A small terminal environment with inline tasks: quick to run, handy to check a setup.

Fixes the seed's version: evaluation actually scores (with the agent and its tools), and the
files live in the workspace, not a home folder that may not exist.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from clotho.agent.result import AgentResult
from clotho.env.base import Environment
from clotho.env.context import ToolContext


class InlineTask(BaseModel):
    name: str
    prompt: str
    path: str
    expected: str


TRAIN = [
    InlineTask(
        name="greeting",
        prompt="Create the file /app/greeting.txt containing exactly: Hello from clotho",
        path="/app/greeting.txt",
        expected="Hello from clotho",
    ),
    InlineTask(
        name="count",
        prompt="Create /app/count.txt with the numbers 1 to 5, one per line.",
        path="/app/count.txt",
        expected="1\n2\n3\n4\n5",
    ),
    InlineTask(
        name="sum",
        prompt="Compute 123 + 456 and write only the result to /app/answer.txt.",
        path="/app/answer.txt",
        expected="579",
    ),
]
EVAL = [
    InlineTask(
        name="answer",
        prompt="Write the number 42 (nothing else) to /app/result.txt.",
        path="/app/result.txt",
        expected="42",
    )
]


class TerminalTestEnv(Environment[InlineTask]):
    name: ClassVar[str] = "terminal_test"

    async def get_next_item(self) -> InlineTask:
        """By `item_cursor`, which `clotho serve --state-dir` saves and restores."""
        item = TRAIN[self.item_cursor % len(TRAIN)]
        self.item_cursor += 1
        return item

    def format_prompt(self, item: InlineTask) -> str:
        return item.prompt

    async def compute_reward(
        self, item: InlineTask, result: AgentResult, ctx: ToolContext
    ) -> float:
        """1.0 for the exact content, 0.5 when it contains the expected text, else 0."""
        try:
            text = (await ctx.read_text(item.path)).strip()
        except FileNotFoundError:
            return 0.0
        if text == item.expected:
            return 1.0
        return 0.5 if item.expected in text else 0.0

    async def evaluation_items(self) -> list[InlineTask]:
        return EVAL

    def sample_label(self, item: InlineTask) -> tuple[str, str]:
        return item.name, "terminal-test"
