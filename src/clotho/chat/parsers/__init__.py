"""Client-side tool-call parsers: the raw text of one assistant turn (special tokens kept)
into content, calls and malformed calls, one module per model format.

    parser = get_parser("hermes", tools)   # one per trajectory: call ids never repeat in it
    result = parser.parse(text)            # .content, .calls, .errors
"""

from clotho.chat.parsers.base import ParsedCall, ParseError, ParseResult, ToolCallParser
from clotho.chat.parsers.registry import UnknownParserError, get_parser, list_parsers

__all__ = [
    "ParseError",
    "ParseResult",
    "ParsedCall",
    "ToolCallParser",
    "UnknownParserError",
    "get_parser",
    "list_parsers",
]
