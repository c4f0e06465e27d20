"""Render conversations with a model's own Jinja chat template, the way Hugging Face does.

Training data must be rendered exactly as the inference server rendered the prompt, so the
Jinja environment copies `transformers`' `apply_chat_template` (sandboxed, `trim_blocks` and
`lstrip_blocks`, loop controls, `tojson` without HTML escaping, `raise_exception`,
`strftime_now`, `{% generation %}` tracking) without depending on `transformers`. Messages are
prepared the way vLLM prepares them for templates (tool-call arguments as dicts, `None`
content as "").
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from clotho.errors import ConfigError

Span = tuple[int, int]

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
# Names a message's reasoning travels under; templates read `reasoning_content` (gpt-oss: `thinking`).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ConfigError, ValueError):
    """A tokenizer or chat template cannot be loaded, or cannot render or mask a conversation."""


class _GenerationTracker(Extension):
    """`{% generation %}...{% endgeneration %}`: the template itself marks the trained text."""

    tags = {"generation"}

    def __init__(self, environment: jinja2.Environment) -> None:
        super().__init__(environment)
        self._state = threading.local()  # one template may render in several threads at once

    def track(self, blocks: list[str] | None, spans: list[Span] | None) -> None:
        """Record spans against the output blocks seen so far (None, None: stop)."""
        self._state.blocks, self._state.spans = blocks, spans

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

    def _mark(self, caller: Any) -> str:
        text = caller()
        blocks, spans = getattr(self._state, "blocks", None), getattr(self._state, "spans", None)
        if blocks is not None and spans is not None:
            start = sum(map(len, blocks))
            spans.append((start, start + len(text)))
        return text


class _TemplateDict:
    """`dict(...)` for templates, without exposing the dict type itself (as in transformers)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore names, so templates cannot reach internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; templates expect plain json.dumps.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTracker, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _plain(value: Any) -> Any:
    """A deep copy made of JSON types only: the sandbox must not see methods of rich objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump(exclude_none=True))
    return f"<{type(value).__name__}>"


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """Arguments as a dict, as templates expect; text that is not a JSON object stays verbatim."""
    fn = call.get("function")
    if isinstance(fn, dict):
        args = fn.get("arguments")
        if args is None or (isinstance(args, str) and not args.strip()):
            fn["arguments"] = {}
        elif isinstance(args, str):
            try:
                parsed = json.loads(args)
            except json.JSONDecodeError:
                parsed = None
            # A malformed call is rendered as the model wrote it, not dropped or "repaired".
            if isinstance(parsed, dict):
                fn["arguments"] = parsed
    return call


def prepare_messages(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """OpenAI-format messages (dicts or pydantic models) as plain dicts a template can render.

    A copy: `None` content becomes "", text-only content parts are joined with newlines (as
    vLLM does), tool-call arguments given as JSON text become dicts, and reasoning is also
    exposed as `reasoning_content` and `thinking` (as transformers does).
    """
    out: list[dict[str, Any]] = []
    for index, raw in enumerate(messages):
        msg = _plain(raw)
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ChatTemplateError(f"message {index} is not a dict with a string 'role': {raw!r}")
        content = msg.get("content")
        if content is None:
            msg["content"] = ""
        elif isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" for p in content
        ):
            msg["content"] = "\n".join(str(p.get("text", "")) for p in content)
        if isinstance(msg.get("tool_calls"), list):
            msg["tool_calls"] = [
                _tool_call(c) if isinstance(c, dict) else c for c in msg["tool_calls"]
            ]
        reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


class ChatTemplate:
    """One compiled chat template plus the special tokens (`bos_token`, ...) it is rendered with."""

    def __init__(
        self, source: str, special_tokens: Mapping[str, Any] | None = None, *, origin: str = ""
    ) -> None:
        self.source = source
        self.origin = origin or "chat template"
        self.special_tokens = dict(special_tokens or {})
        self._env = _environment()
        try:
            self._compiled = self._env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"{self.origin}: invalid Jinja at line {exc.lineno}: {exc.message}"
            ) from exc
        self.has_generation_tags = bool(_GENERATION_TAG.search(source))

    def render(
        self,
        messages: Iterable[Any],
        tools: list[Any] | None = None,
        *,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str:
        """The conversation as the model sees it; kwargs (e.g. `enable_thinking`) go to the template."""
        return self.render_tracked(
            messages, tools, add_generation_prompt=add_generation_prompt, **kwargs
        )[0]

    def render_tracked(
        self,
        messages: Iterable[Any],
        tools: list[Any] | None = None,
        *,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> tuple[str, list[Span]]:
        """The rendering plus the character spans the template wrapped in `{% generation %}`."""
        context = {
            **self.special_tokens,
            **_plain(kwargs),
            "messages": prepare_messages(messages),
            "tools": _plain(tools) if tools is not None else None,
            "add_generation_prompt": add_generation_prompt,
        }
        tracker = self._env.extensions[_GenerationTracker.identifier]
        assert isinstance(tracker, _GenerationTracker)
        blocks: list[str] = []
        spans: list[Span] = []
        tracker.track(blocks, spans)
        try:
            for block in self._compiled.generate(**context):
                blocks.append(block)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"{self.origin} cannot render the conversation: {exc}") from exc
        except (TypeError, AttributeError, KeyError, IndexError) as exc:
            raise ChatTemplateError(
                f"{self.origin} cannot render the conversation: {exc!r}"
            ) from exc
        finally:
            tracker.track(None, None)
        return "".join(blocks), spans
