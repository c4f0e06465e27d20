"""TEST DOUBLE for a token-in/token-out model: replays scripted turns as real token ids.

A hosted model cannot run here, so `ReplayTokenClient` implements the `TokenClient`
interface by tokenizing scripted turn texts with a real tokenizer and returning those ids,
with distinct made-up logprobs (-0.01 * (turn + 1) - 0.0001 * position), so that any
misalignment between ids, masks and logprobs shows. It records every prompt it was given.
"""

from __future__ import annotations

from collections.abc import Sequence

from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import Generation, TokenSampling


class ReplayTokenClient:
    def __init__(self, tokenizer: TemplateTokenizer, turns: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.prompts: list[list[int]] = []
        self.samplings: list[TokenSampling] = []
        self.generations: list[Generation] = []
        self.closed = False

    async def generate(self, prompt_ids: Sequence[int], sampling: TokenSampling) -> Generation:
        self.prompts.append(list(prompt_ids))
        self.samplings.append(sampling)
        turn = len(self.generations)
        if turn >= len(self.turns):
            raise AssertionError(f"the script has {len(self.turns)} turns; turn {turn} asked")
        ids = self.tokenizer.encode(self.turns[turn])
        finish = "stop" if ids and ids[-1] in sampling.stop_token_ids else "length"
        logprobs = [-0.01 * (turn + 1) - 0.0001 * i for i in range(len(ids))]
        generation = Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish)
        self.generations.append(generation)
        return generation

    async def aclose(self) -> None:
        self.closed = True
