"""Talking to models: message types and the OpenAI-compatible chat client."""

from clotho.chat.client import ChatClient, ModelConfig, SamplingParams
from clotho.chat.types import ChatResponse, FunctionCall, Message, ToolCall, Usage

__all__ = [
    "ChatClient",
    "ChatResponse",
    "FunctionCall",
    "Message",
    "ModelConfig",
    "SamplingParams",
    "ToolCall",
    "Usage",
]
