"""Talking to models: the parsed turn every client returns, the chat and token clients, and the
`Model`/`ModelSession` interfaces the agent loop uses."""

from clotho.chat.client import ChatClient, ModelConfig, SamplingParams
from clotho.chat.types import InvalidToolCall, ModelTurn, ToolCall, Usage

__all__ = [
    "ChatClient",
    "InvalidToolCall",
    "ModelConfig",
    "ModelTurn",
    "SamplingParams",
    "ToolCall",
    "Usage",
]
