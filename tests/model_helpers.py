"""What the model tests share: a scripted answer held open until the test lets it go, and the
real embedded model (llama.cpp) loaded for a module's tests (`model_fixture`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.scripted_openai import assistant
from tests.support import PATIENCE_S


class Held:
    """A script entry whose answer waits until `release` is set (or the test's patience
    runs out): a caller that got any answer from it waited for it."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.answered = 0

    def __call__(self, body: Any) -> dict[str, Any]:
        self.release.wait(PATIENCE_S)
        self.answered += 1
        return assistant("too late")


@contextlib.contextmanager
def embedded_model(n_ctx: int) -> Iterator[tuple[Any, Any]]:
    """(client, tokenizer) of the embedded model with an `n_ctx` context, closed on exit.
    Needs the `local` extra: the caller skips without it."""
    from clotho.chat.local_model import load_embedded_model

    client, tokenizer = load_embedded_model(n_ctx=n_ctx)
    try:
        yield client, tokenizer
    finally:
        client.close()


def model_fixture(n_ctx: int) -> Callable[[], Iterator[tuple[Any, Any]]]:
    """A module-scoped `model` fixture, (client, tokenizer) of the embedded model with an
    `n_ctx` context: `model = model_fixture(1024)` in the test module."""

    @pytest.fixture(scope="module", name="model")
    def model() -> Iterator[tuple[Any, Any]]:
        with embedded_model(n_ctx) as loaded:
            yield loaded

    return model
