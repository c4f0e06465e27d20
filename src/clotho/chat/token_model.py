"""Phase 2: a token-in/token-out backend as a `Model`, with exact tokens and logprobs.

`TokenModel` is shared by every rollout (backend, tokenizer, chat template, tool-call
parser name). Each rollout gets a `TokenChatSession` from `session()`: it keeps the rollout's
`TokenLedger`, sends only token ids to the backend, and reads each sampled turn once into a
`ModelTurn`: the ledger decodes the ids, reasoning is split off, and the parser reads the
tool calls client-side. Calls the parser could not read are handed to the loop as invalid
calls, so the model is told what was wrong, and the other calls of the turn still run.

The context budget is `max_context_tokens`; unset, it is read once from a client that can
tell (`read_context_length`: vLLM, SGLang, `clotho serve-model`), so a conversation that fills
the context ends as the agent's `token_limit` before the server refuses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from clotho.chat.ledger import OnBreak, TokenLedger, TokenSequence, stop_token_ids
from clotho.chat.parsers import ToolCallParser, get_parser
from clotho.chat.reasoning import split_reasoning
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import TokenClient, TokenSampling
from clotho.chat.tool_prompt import renders_tools, tools_text, with_tools_text
from clotho.chat.types import InvalidToolCall, ModelTurn, ToolCall, Usage
from clotho.errors import AgentLimit

log = logging.getLogger(__name__)


@runtime_checkable
class ContextReader(Protocol):
    """A token client that can ask its server for the model's context length."""

    async def read_context_length(self) -> tuple[int | None, str]:
        """(tokens or None, where it was read or why not); never raises."""
        ...


class ContextFull(AgentLimit):
    """The conversation filled the model's context: the rollout ends with `token_limit`."""


@dataclass(eq=False)
class TokenModel:
    """A token backend with the model's tokenizer, template and tool-call format.

    Construction renders the template a few times (stop ids, whether it shows tools): build it
    off the event loop (`clotho.chat.models.build_model` does).
    """

    client: TokenClient
    tokenizer: TemplateTokenizer
    tool_parser: str = "hermes"
    # Without stop ids, the template's end-of-turn ids are the stops.
    sampling: TokenSampling = field(default_factory=TokenSampling)
    max_context_tokens: int | None = None
    on_break: OnBreak = "split"
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # A template with no place for tools gets them in the system message instead.
    tools_in_system: bool = field(init=False)
    # The text of each stop id, to cut it off the decoded turn without decoding again.
    stop_texts: dict[int, str] = field(init=False)
    # max_context_tokens unset and a client that can read it: read at the first turn.
    _context_unread: bool = field(init=False)
    _context_lock: asyncio.Lock = field(init=False)

    def __post_init__(self) -> None:
        self.template_kwargs = dict(self.template_kwargs)
        if not self.sampling.stop_token_ids:
            stops = stop_token_ids(self.tokenizer, self.template_kwargs)
            self.sampling = self.sampling.model_copy(update={"stop_token_ids": stops})
        get_parser(self.tool_parser)  # an unknown format fails now, not in the first rollout
        self.tools_in_system = not renders_tools(self.tokenizer, self.template_kwargs)
        self.stop_texts = {i: self.tokenizer.decode([i]) for i in self.sampling.stop_token_ids}
        self._context_unread = self.max_context_tokens is None and isinstance(
            self.client, ContextReader
        )
        self._context_lock = asyncio.Lock()

    async def context_budget(self) -> int | None:
        """The context a conversation must fit: `max_context_tokens`, else the server's,
        asked once for all rollouts (said once in the log, found or not)."""
        if self._context_unread:
            async with self._context_lock:
                client = self.client
                if self._context_unread and isinstance(client, ContextReader):
                    tokens, source = await client.read_context_length()
                    self.max_context_tokens = tokens
                    self._context_unread = False
                    if tokens is not None:
                        log.info(
                            "model context: %d tokens (%s); a conversation that fills it "
                            "ends as token_limit",
                            tokens,
                            source,
                        )
                    else:
                        log.warning(
                            "the model server does not say the model's context (%s): set "
                            "model.max_context_tokens so a full context ends as token_limit "
                            "before the server refuses it",
                            source,
                        )
        return self.max_context_tokens

    def session(self) -> TokenChatSession:
        """A fresh ledger and parser for one rollout."""
        return TokenChatSession(self)

    async def aclose(self) -> None:
        await self.client.aclose()


class TokenChatSession:
    """One rollout's `ModelSession`: renders, generates from ids, parses, keeps the ledger."""

    def __init__(self, model: TokenModel) -> None:
        self.model = model
        self.ledger: TokenLedger | None = None
        self._parser: ToolCallParser | None = None
        self._tools_text: str | None = None  # set when the template cannot show the tools

    def _start(self, tools: list[dict[str, Any]] | None) -> tuple[TokenLedger, ToolCallParser]:
        model = self.model
        if tools and model.tools_in_system:
            self._tools_text = tools_text(tools, model.tool_parser)
        self.ledger = TokenLedger(
            model.tokenizer,
            None if self._tools_text else tools,
            on_break=model.on_break,
            template_kwargs=model.template_kwargs,
        )
        self._parser = get_parser(model.tool_parser, tools=tools)
        return self.ledger, self._parser

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> ModelTurn:
        model = self.model
        if self.ledger is None or self._parser is None:
            ledger, parser = self._start(tools)
        else:
            ledger, parser = self.ledger, self._parser
        prompt = ledger.prompt(self._prepared(messages))
        sampling = model.sampling
        context = await model.context_budget()
        if context is not None:
            room = context - len(prompt)
            if room <= 0:
                raise ContextFull(f"the prompt has {len(prompt)} tokens, the context {context}")
            if room < sampling.max_tokens:
                sampling = sampling.model_copy(update={"max_tokens": room})
        started = time.perf_counter()
        generation = await model.client.generate(prompt, sampling)
        text = ledger.record(generation)
        ids = generation.token_ids
        if ids and ids[-1] in sampling.stop_token_ids:
            stop = model.stop_texts.get(ids[-1])
            # A stop id decodes on its own as it does at the end of the turn, but check.
            text = (
                text.removesuffix(stop)
                if stop and text.endswith(stop)
                else model.tokenizer.decode(ids[:-1])
            )
        reasoning, content = split_reasoning({"content": text})
        parsed = parser.parse(content or "")
        n = len(ids)
        return ModelTurn(
            content=parsed.content or "",
            reasoning=reasoning,
            tool_calls=[
                ToolCall(
                    id=call.id,
                    name=call.name,
                    arguments=call.arguments,
                    text=json.dumps(call.arguments, ensure_ascii=False),
                )
                for call in parsed.calls
            ],
            invalid_tool_calls=[
                InvalidToolCall(name=e.name, text=e.raw, error=e.message) for e in parsed.errors
            ],
            finish_reason=generation.finish_reason,
            usage=Usage(
                prompt_tokens=len(prompt), completion_tokens=n, total_tokens=len(prompt) + n
            ),
            latency_s=generation.latency_s or time.perf_counter() - started,
        )

    def sequences(self, messages: Sequence[dict[str, Any]]) -> list[TokenSequence]:
        """The rollout's training sequences, given its final conversation (the agent's)."""
        if self.ledger is None:
            return []
        return self.ledger.finish(self._prepared(messages))

    def _prepared(self, messages: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
        """The conversation as rendered: with the tools in the system message if needed."""
        return with_tools_text(messages, self._tools_text) if self._tools_text else messages
