"""A model's tokenizer and chat template from local files, and loss masks for its assistant turns.

Phase 1 of scored data: the conversation comes back from a chat endpoint as text, so the
training sequence is the tokenization of the template's rendering of the whole conversation,
and only what the assistant generated is trained (its content, the reasoning the template
keeps, its tool calls and its end-of-turn token). Nothing is downloaded: the caller names a
tokenizer directory or `tokenizer.json`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from clotho.chat.template import ChatTemplate, ChatTemplateError, Span, prepare_messages
from clotho.chat.tokens import MASKED

_TEMPLATE_FILES = ("chat_template.jinja",)
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token")
_SPECIAL_KEYS += ("mask_token",)
# Reasoning that templates drop from earlier turns (Qwen3, DeepSeek-R1 and their kin).
_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
_LEADING_THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


class TemplateTokenizer:
    """Renders with the model's chat template and tokenizes with its tokenizer."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate) -> None:
        self.tokenizer = tokenizer
        self.template = template
        added = tokenizer.get_added_tokens_decoder().values()
        # Longest first, so that an end-of-turn token is not mistaken for a shorter one inside it.
        self._special = sorted({t.content for t in added if t.special}, key=len, reverse=True)

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        chat_template: str | Path | None = None,
        template_name: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
    ) -> TemplateTokenizer:
        """Load `tokenizer.json` (a directory holding it, or the file) and the chat template.

        The template is found as `load_chat_template` says; it is checked before the tokenizer
        file is read, so a template problem is reported at once.
        """
        path = Path(path)
        if not path.exists():
            raise ChatTemplateError(f"tokenizer path {path} does not exist")
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ChatTemplateError(
                f"{file.parent} has no tokenizer.json: a Hugging Face fast-tokenizer file is needed"
            )
        template = load_chat_template(
            path,
            chat_template=chat_template,
            template_name=template_name,
            special_tokens=special_tokens,
        )
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise ChatTemplateError(f"{file} is not a tokenizers JSON file: {exc}") from exc
        return cls(tokenizer, template)

    @property
    def special_tokens(self) -> list[str]:
        """The tokenizer's special tokens, longest first."""
        return list(self._special)

    def encode(self, text: str) -> list[int]:
        """Token ids of text, with no special tokens added beyond those written in it."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def render(self, messages: Sequence[Any], tools: list[Any] | None = None, **kwargs: Any) -> str:
        """`ChatTemplate.render` with this tokenizer's template (`add_generation_prompt`, ...)."""
        return self.template.render(messages, tools, **kwargs)

    def assistant_spans(
        self, messages: Sequence[Any], tools: list[Any] | None = None, **kwargs: Any
    ) -> tuple[str, list[Span]]:
        """The rendered conversation and, per assistant message, the characters it generated.

        A template with `{% generation %}` marks them itself. Otherwise each turn is the
        difference between the conversation rendered up to it with the generation prompt and
        rendered through it, so the header (`<|im_start|>assistant\\n`) stays out; text after
        its end-of-turn token (a newline) too. Where the final rendering differs from those
        prefixes (Qwen3 drops `<think>` from earlier turns), the turn is looked up in it,
        with the reasoning block removed if need be; a turn not found raises.
        """
        if "add_generation_prompt" in kwargs:
            raise TypeError(
                "assistant_spans renders the finished conversation: no generation prompt"
            )
        msgs = prepare_messages(messages)
        text, tagged = self.template.render_tracked(msgs, tools, **kwargs)
        if self.template.has_generation_tags:
            return text, tagged
        spans: list[Span] = []
        cursor = 0
        for index, message in enumerate(msgs):
            if message["role"] == "assistant":
                span = self._locate(text, msgs, index, cursor, tools, kwargs)
                spans.append(span)
                cursor = span[1]
        return text, spans

    def tokens_and_masks(
        self, messages: Sequence[Any], tools: list[Any] | None = None, **kwargs: Any
    ) -> tuple[list[int], list[int]]:
        """Token ids of the rendered conversation, and masks: the id on assistant tokens, else -100.

        A token that straddles a turn boundary counts as the assistant's.
        """
        text, spans = self.assistant_spans(messages, tools, **kwargs)
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        tokens = list(encoding.ids)
        masks = [MASKED] * len(tokens)
        inside = bytearray(len(text) + 1)  # 1 on assistant characters
        for start, end in spans:
            inside[start:end] = b"\x01" * (end - start)
        covered = bytearray(len(text) + 1)  # 1 on characters of masked-in tokens
        for k, (a, b) in enumerate(encoding.offsets):
            if (1 in inside[a:b]) if b > a else inside[a]:
                masks[k] = tokens[k]
                covered[a:b] = b"\x01" * (b - a)
        for start, end in spans:
            if start < end and 1 not in covered[start:end]:
                raise ChatTemplateError(
                    f"no token's offsets cover assistant text {text[start:end]!r}"
                )
        return tokens, masks

    def _locate(
        self,
        text: str,
        msgs: list[dict[str, Any]],
        index: int,
        cursor: int,
        tools: list[Any] | None,
        kwargs: dict[str, Any],
    ) -> Span:
        where = f"assistant message {index}"

        def render(upto: int, generation_prompt: bool = False) -> str:
            try:
                return self.template.render(
                    msgs[:upto], tools, add_generation_prompt=generation_prompt, **kwargs
                )
            except ChatTemplateError as exc:
                raise ChatTemplateError(f"{where}: {exc}") from exc

        prompt, turn = render(index, generation_prompt=True), render(index + 1)
        if not turn.startswith(prompt):
            raise ChatTemplateError(
                f"{where}: the conversation rendered through it does not start with the one "
                f"rendered up to it with the generation prompt ({prompt[-60:]!r}), so the "
                "header cannot be told from the generated text"
            )
        segment = self._trim_end(turn[len(prompt) :])
        if text.startswith(turn) and len(prompt) >= cursor:
            return len(prompt), len(prompt) + len(segment)
        # Not prefix-preserving: find "header + turn" in the final text, as rendered or with the
        # reasoning block removed; the earliest match after the previous turn wins.
        bare = render(index)
        header = prompt[len(bare) :] if prompt.startswith(bare) else ""
        candidates = {
            (header, segment),
            (_THINK.sub("", header, count=1), _LEADING_THINK.sub("", segment, count=1)),
        }
        found: list[Span] = []
        for head, body in candidates:
            # Whitespace the template strips after the reasoning may stay in the final text.
            gap = r"\s*" if head else ""
            match = re.compile(re.escape(head) + f"({gap}{re.escape(body)})").search(text, cursor)
            if match:
                found.append(match.span(1))
        if found:
            return min(found)
        raise ChatTemplateError(
            f"{where}: its rendered text {segment[:120]!r} is not in the rendering of the whole "
            "conversation (the template rewrites earlier turns), so its mask cannot be built"
        )

    def _trim_end(self, segment: str) -> str:
        """Drop what follows the end-of-turn token (a newline): the model does not generate it."""
        stripped = segment.rstrip()
        if any(stripped.endswith(token) for token in self._special):
            return stripped
        return segment


def load_chat_template(
    path: str | Path,
    *,
    chat_template: str | Path | None = None,
    template_name: str | None = None,
    special_tokens: Mapping[str, str] | None = None,
) -> ChatTemplate:
    """The chat template of a tokenizer directory (or of the folder of its `tokenizer.json`).

    In order: `chat_template` (a `Path` or a file name is read; a string with `{{` or `{%` is
    the template itself), `chat_template.jinja` in the folder, or `chat_template` in
    `tokenizer_config.json` (`template_name` picks one of a named list, default "default").
    Special tokens for the template come from `tokenizer_config.json`, then `special_tokens`.
    """
    path = Path(path)
    if not path.exists():
        raise ChatTemplateError(f"tokenizer path {path} does not exist")
    folder = path if path.is_dir() else path.parent
    config = _read_config(folder / "tokenizer_config.json")
    source, origin = _find_template(folder, config, chat_template, template_name)
    specials = {**_config_special_tokens(config), **(special_tokens or {})}
    return ChatTemplate(source, specials, origin=origin)


def _read_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChatTemplateError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ChatTemplateError(f"{path} does not hold a JSON object")
    return config


def _read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"cannot read chat template {path}: {exc}") from exc


def _find_template(
    folder: Path, config: dict[str, Any], explicit: str | Path | None, name: str | None
) -> tuple[str, str]:
    """(template source, where it came from) by the precedence `load_chat_template` documents."""
    if isinstance(explicit, str) and ("{{" in explicit or "{%" in explicit):
        return explicit, "the chat template given"
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise ChatTemplateError(
                f"chat template {str(explicit)!r} is neither Jinja text nor an existing file"
            )
        return _read_template(path), str(path)
    for file_name in _TEMPLATE_FILES:
        if (folder / file_name).is_file():
            return _read_template(folder / file_name), str(folder / file_name)
    where = f"{folder / 'tokenizer_config.json'} chat_template"
    value = config.get("chat_template")
    if isinstance(value, str) and name is None:
        return value, where
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get(name or "default")
        if isinstance(chosen, str):
            return chosen, f"{where} {name or 'default'!r}"
        raise ChatTemplateError(
            f"{where} has no template named {name or 'default'!r} (it has {sorted(map(str, named))})"
        )
    if isinstance(value, str):
        raise ChatTemplateError(f"{where} is a single template: there is none named {name!r}")
    raise ChatTemplateError(
        f"no chat template in {folder}: no chat_template.jinja and no chat_template in "
        "tokenizer_config.json; pass chat_template= (the template text or a .jinja file)"
    )


def _config_special_tokens(config: dict[str, Any]) -> dict[str, Any]:
    """bos_token, eos_token, ... as strings (configs write them as text or AddedToken dicts)."""

    def text(value: Any) -> str | None:
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) else None

    out: dict[str, Any] = {}
    for key in _SPECIAL_KEYS:
        if (value := text(config.get(key))) is not None:
            out[key] = value
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        out["additional_special_tokens"] = [t for t in map(text, extra) if t is not None]
    return out
