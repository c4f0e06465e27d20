"""The `vision` toolset: `analyze_image` sends an image from the sandbox to a vision model.

The image (a screenshot the agent took, a chart it drew, a picture the task ships) is read
through the sandbox's file API, checked to be an image by its bytes, and sent to the
configured OpenAI-compatible model as an `image_url` content part holding a data: URL
(`clotho.chat.types.image_part`), beside the agent's question. The model's answer is the
tool's result. No model named, or its key variable unset, is a `ConfigError` at setup.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from clotho.chat.http import MalformedResponse
from clotho.chat.types import image_mime, image_part
from clotho.errors import ConfigError
from clotho.tools.hosted import HostedApi
from clotho.tools.runtime import ToolFailure, ToolRuntime, truncate_middle
from clotho.tools.tool import Tool, tool


class VisionConfig(BaseModel):
    """The model `analyze_image` asks (OpenAI Chat Completions with image content)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(None, description="the API root, ending in /v1")
    model: str | None = Field(None, description="the vision model's name at that endpoint")
    api_key_env: str | None = Field(
        None, description="the environment variable holding the key (none: no key is sent)"
    )
    max_image_bytes: int = Field(20 << 20, ge=1024)
    max_tokens: int = Field(1024, ge=1)
    detail: str | None = Field(None, description="the image part's detail: low, high or auto")
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(2, ge=0)


class VisionModel(HostedApi):
    config: VisionConfig

    def check(self) -> None:
        config = self.config
        if not config.base_url or not config.model:
            raise ConfigError(
                "the vision toolset needs a vision model: set tools.vision.base_url (an "
                "OpenAI-compatible API) and tools.vision.model"
            )
        if config.api_key_env and self._key() is None:
            raise ConfigError(
                f"the vision toolset's key is missing: set the environment variable "
                f"{config.api_key_env} (tools.vision.api_key_env)"
            )

    async def ask(self, question: str, image: bytes) -> str:
        config = self.config
        if not config.base_url or not config.model:
            raise ToolFailure("the vision toolset is not configured (no model)")
        body: dict[str, Any] = {
            "model": config.model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": question},
                        image_part(image, detail=config.detail),
                    ],
                }
            ],
            "max_tokens": config.max_tokens,
        }
        return await self._post(
            "/chat/completions", body, _answer, failed="the vision model failed"
        )


def _answer(data: Any) -> str:
    content = data["choices"][0]["message"]["content"]
    if isinstance(content, list):  # some servers answer in parts too
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise MalformedResponse("the vision model's reply has no text")
    return content


def vision_tools(model: VisionModel) -> list[Tool]:
    @tool(name="analyze_image")
    async def analyze_image(
        rt: ToolRuntime, path: str, question: str = "Describe this image in detail."
    ) -> str:
        """Look at an image file (PNG, JPEG, GIF or WebP) with a vision model and answer a
        question about it: a screenshot you took, a chart you drew, a picture the task gave.

        Args:
            path: the image file (relative paths start at the working directory).
            question: what to find out from the image.
        """
        limit = model.config.max_image_bytes
        try:
            data = await rt.sandbox.read_file(path, max_bytes=limit)
        except FileNotFoundError as exc:
            raise ToolFailure(f"file not found: {path}") from exc
        except IsADirectoryError as exc:
            raise ToolFailure(f"{path} is a directory") from exc
        except OSError as exc:  # larger than the limit, or not a regular file
            raise ToolFailure(f"cannot read {path} as an image: {exc}") from exc
        if image_mime(data) is None:
            raise ToolFailure(f"{path} is not a PNG, JPEG, GIF or WebP image")
        answer = await model.ask(question, data)
        return truncate_middle(
            answer.strip() or "(the vision model gave no answer)", rt.max_output_chars
        )

    return [analyze_image]
