"""The token ledger of one rollout: exactly the tokens the model saw and sampled.

The first prompt is the chat template's rendering, tokenized once. After each sampled turn
the ledger appends the sampled ids as they came (trained, with their logprobs) and then only
the text the template adds after them: the rest of the assistant turn (its end-of-turn
newline, or the whole closing when the model was cut off) and the new tool or user turns
with the next generation prompt. Earlier tokens are never re-tokenized, so nothing drifts at
template boundaries.

The delta is the template's own: the conversation rendered through the new messages must
start with the conversation rendered through the assistant turn, which must start with the
prompt the model was given. A template that rewrites earlier turns (Qwen3 drops earlier
`<think>` blocks once a new user turn starts) breaks this; the break is detected and, by
default, the trajectory continues as a new training sequence whose prompt is the fresh
rendering (`on_break="split"`); `on_break="error"` raises instead. Never a silently wrong one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from clotho.chat.template import ChatTemplateError
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import MASKED, NOT_SAMPLED, Generation

OnBreak = Literal["split", "error"]
_PROBE = "\x00clotho-probe\x00"


class TemplateBreak(ChatTemplateError):
    """The chat template rewrote earlier turns, and the ledger was told not to split."""


class TokenSequence(BaseModel):
    """One training sequence: ids, masks (the id where sampled, else -100), logprobs."""

    tokens: list[int] = Field(default_factory=list)
    masks: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)

    def extend(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        """Append ids; with logprobs they are sampled (trained), without they are context."""
        self.tokens.extend(ids)
        if logprobs is None:
            self.masks.extend([MASKED] * len(ids))
            self.logprobs.extend([NOT_SAMPLED] * len(ids))
        else:
            self.masks.extend(ids)
            self.logprobs.extend(logprobs)

    @property
    def sampled(self) -> int:
        return sum(1 for m in self.masks if m != MASKED)


class TokenLedger:
    """Builds the prompts of one rollout and records what was sampled, turn by turn."""

    def __init__(
        self,
        tokenizer: TemplateTokenizer,
        tools: list[dict[str, Any]] | None = None,
        *,
        on_break: OnBreak = "split",
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.on_break = on_break
        self.template_kwargs = dict(template_kwargs or {})
        self.sequences: list[TokenSequence] = []
        self.breaks: list[int] = []  # message counts where a new sequence started
        self._rendered = ""  # the template's text of the current prompt
        self._seen = 0  # messages the current prompt covers
        self._sampled_text: str | None = None  # decoded ids of the last turn, if not yet closed
        self._closing = closing_text(tokenizer, template_kwargs)

    @property
    def current(self) -> TokenSequence:
        return self.sequences[-1]

    def _render(self, messages: Sequence[dict[str, Any]], generation_prompt: bool) -> str:
        return self.tokenizer.render(
            messages, self.tools, add_generation_prompt=generation_prompt, **self.template_kwargs
        )

    def prompt(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The token ids to generate from, given the whole conversation so far.

        `messages` must extend what the ledger saw: the previous prompt's messages, then the
        assistant turn built from the last generation, then the new tool or user messages.
        """
        if not self.sequences:
            self._start(messages)
            return list(self.current.tokens)
        if self._sampled_text is None:
            raise ValueError("prompt() again before record(): no turn was sampled in between")
        if len(messages) < self._seen + 1 or messages[self._seen].get("role") != "assistant":
            raise ValueError(
                f"message {self._seen} should be the assistant turn sampled last "
                f"(the ledger covers {self._seen} messages)"
            )
        rendered = self._render(messages, True)
        if not rendered.startswith(self._rendered):  # an earlier turn was rewritten
            self._break(messages, rendered)
            return list(self.current.tokens)
        added = self._after_sampled(messages, rendered)
        if added is None:
            self._break(messages, rendered)
            return list(self.current.tokens)
        self.current.extend(self.tokenizer.encode(added))
        self._rendered, self._seen, self._sampled_text = rendered, len(messages), None
        return list(self.current.tokens)

    def record(self, generation: Generation) -> str:
        """Append what the model sampled for the current prompt, exactly as sampled.

        Returns the sampled ids decoded (special tokens kept): the one decoding of the turn.
        """
        if not self.sequences or self._sampled_text is not None:
            raise ValueError("record() needs a prompt() first, and once per prompt")
        self.current.extend(generation.token_ids, generation.logprobs)
        self._sampled_text = self.tokenizer.decode(generation.token_ids)
        return self._sampled_text

    def finish(self, messages: Sequence[dict[str, Any]]) -> list[TokenSequence]:
        """Close the last turn the way the template does, and return the training sequences.

        After this, for a prefix-preserving template, the last sequence's tokens are the
        tokenization of the template applied to the final conversation.
        """
        if self._sampled_text is not None and len(messages) > self._seen:
            through_turn = self._render(messages[: self._seen + 1], False)
            if through_turn.startswith(self._rendered):
                rest = self._rest_of_turn(through_turn[len(self._rendered) :])
            else:
                rest = self._closing_after(self._sampled_text)
            self.current.extend(self.tokenizer.encode(rest))
            self._sampled_text = None
        return [s for s in self.sequences if s.sampled]

    # -- internals ---------------------------------------------------------------------

    def _start(self, messages: Sequence[dict[str, Any]]) -> None:
        self._rendered = self._render(messages, True)
        self.sequences.append(TokenSequence())
        self.current.extend(self.tokenizer.encode(self._rendered))
        self._seen, self._sampled_text = len(messages), None

    def _break(self, messages: Sequence[dict[str, Any]], rendered: str) -> None:
        if self.on_break == "error":
            raise TemplateBreak(
                f"the chat template rewrites earlier turns at message {self._seen} (it is not "
                "prefix-preserving); use on_break='split' to train on separate sequences"
            )
        # The old sequence ends with the sampled turn closed as the template closes turns.
        self.current.extend(self.tokenizer.encode(self._closing_after(self._sampled_text or "")))
        self.breaks.append(len(messages))
        self._start(messages)

    def _after_sampled(self, messages: Sequence[dict[str, Any]], rendered: str) -> str | None:
        """The text that follows the sampled ids in the next prompt: the rest of the turn,
        the new messages and the generation prompt; None if the turn's end cannot be found.

        The turn is read as the template writes it mid-conversation (`rendered`), which can
        differ from the turn rendered last (Qwen3 writes an empty `<think>` block only on the
        last turn): the model's ids stand either way.
        """
        sampled = self._sampled_text or ""
        after = rendered[len(self._rendered) :]
        if sampled and after.startswith(sampled):
            return after[len(sampled) :]
        through_turn = self._render(messages[: self._seen + 1], False)
        if through_turn.startswith(self._rendered) and rendered.startswith(through_turn):
            turn = through_turn[len(self._rendered) :]
            return self._rest_of_turn(turn) + rendered[len(through_turn) :]
        # The template words the turn its own way: it ends at the template's turn closing.
        end = after.find(self._closing) if self._closing else -1
        if end < 0:
            return None
        return self._closing_after(sampled) + after[end + len(self._closing) :]

    def _rest_of_turn(self, turn: str) -> str:
        """What the template writes after the sampled text, within the assistant turn."""
        sampled = self._sampled_text or ""
        if sampled and turn.startswith(sampled):
            return turn[len(sampled) :]
        # The template renders the turn in its own words (normalized JSON, stripped
        # whitespace): the model's tokens stand, and only the closing is added.
        return self._closing_after(sampled)

    def _closing_after(self, sampled: str) -> str:
        closing = self._closing
        for k in range(len(closing), 0, -1):
            if sampled.endswith(closing[:k]):
                return closing[k:]
        return closing


def closing_text(tokenizer: TemplateTokenizer, template_kwargs: dict[str, Any] | None) -> str:
    """The text a template writes after an assistant message's content (`<|im_end|>\\n`)."""
    kwargs = dict(template_kwargs or {})
    user = [{"role": "user", "content": "hi"}]
    with_turn = [*user, {"role": "assistant", "content": _PROBE}]
    try:
        text = tokenizer.render(with_turn, None, add_generation_prompt=False, **kwargs)
    except ChatTemplateError as exc:
        raise ChatTemplateError(f"cannot find how the template ends a turn: {exc}") from exc
    if _PROBE not in text:
        raise ChatTemplateError("the chat template drops the assistant's content")
    return text[text.rindex(_PROBE) + len(_PROBE) :]


def stop_token_ids(
    tokenizer: TemplateTokenizer, template_kwargs: dict[str, Any] | None
) -> list[int]:
    """End-of-turn ids: special tokens in the template's turn closing, and the eos token."""
    closing = closing_text(tokenizer, template_kwargs)
    names = [t for t in tokenizer.special_tokens if t in closing]
    eos = tokenizer.template.special_tokens.get("eos_token")
    if isinstance(eos, str) and eos:
        names.append(eos)
    ids: list[int] = []
    for name in names:
        token_id = tokenizer.tokenizer.token_to_id(name)
        if token_id is not None and token_id not in ids:
            ids.append(token_id)
    return ids
