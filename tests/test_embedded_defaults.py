"""The embedded model's replies are bounded by default, so `clotho eval --agent llm` with no
sampling flags finishes in minutes on a CPU; a bound given explicitly still wins."""

from __future__ import annotations

import pytest

from clotho.chat.client import ModelConfig, SamplingParams
from clotho.chat.models import DEFAULT_MAX_TOKENS, EMBEDDED_DEFAULT_MAX_TOKENS, load_model
from clotho.chat.token_model import TokenModel

pytest.importorskip("llama_cpp", reason="the embedded model needs the local extra")


def test_the_embedded_model_bounds_its_replies_unless_told() -> None:
    default = load_model(ModelConfig())
    assert isinstance(default, TokenModel)
    assert default.sampling.max_tokens == EMBEDDED_DEFAULT_MAX_TOKENS < DEFAULT_MAX_TOKENS
    told = load_model(ModelConfig(sampling=SamplingParams(max_tokens=600)))
    assert isinstance(told, TokenModel) and told.sampling.max_tokens == 600
