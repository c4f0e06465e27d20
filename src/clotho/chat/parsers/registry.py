"""Parser names, as a model's config gives them, to parser classes."""

from __future__ import annotations

from typing import Any

from clotho.chat.parsers.base import ToolCallParser
from clotho.chat.parsers.deepseek_v3 import DeepSeekV3Parser
from clotho.chat.parsers.deepseek_v3_1 import DeepSeekV31Parser
from clotho.chat.parsers.glm45 import Glm45Parser
from clotho.chat.parsers.glm47 import Glm47Parser
from clotho.chat.parsers.hermes import HermesParser
from clotho.chat.parsers.kimi_k2 import KimiK2Parser
from clotho.chat.parsers.llama3_json import Llama3JsonParser
from clotho.chat.parsers.llama4_json import Llama4JsonParser
from clotho.chat.parsers.longcat import LongcatParser
from clotho.chat.parsers.mistral import MistralParser, MistralV11Parser
from clotho.chat.parsers.qwen import QwenParser
from clotho.chat.parsers.qwen3_coder import Qwen3CoderParser

PARSERS: dict[str, type[ToolCallParser]] = {
    cls.name: cls
    for cls in (
        HermesParser,
        QwenParser,
        LongcatParser,
        MistralParser,
        MistralV11Parser,
        Llama3JsonParser,
        Llama4JsonParser,
        Qwen3CoderParser,
        DeepSeekV3Parser,
        DeepSeekV31Parser,
        KimiK2Parser,
        Glm45Parser,
        Glm47Parser,
    )
}


class UnknownParserError(ValueError):
    """No tool-call parser has this name."""


# Other spellings of the same formats (vLLM's `--tool-call-parser deepseek_v31`, the seed's).
ALIASES: dict[str, str] = {"deepseek_v31": "deepseek_v3_1"}


def list_parsers() -> list[str]:
    return sorted(PARSERS)


def get_parser(name: str, tools: list[dict[str, Any]] | None = None) -> ToolCallParser:
    """A new parser for one trajectory; `tools` are the OpenAI tool schemas, used to type
    the values of the XML formats."""
    try:
        cls = PARSERS[ALIASES.get(name, name)]
    except KeyError:
        known = ", ".join(list_parsers())
        raise UnknownParserError(f"no tool-call parser named {name!r}; known: {known}") from None
    return cls(tools)
