# transitional: removed once env/runs import from clotho.chat (there build_model is async)
from clotho.chat.client import ChatClient, ModelConfig
from clotho.chat.models import DEFAULT_MAX_TOKENS, token_sampling  # noqa: F401
from clotho.chat.models import load_token_model as _load_token_model


def build_model(config: ModelConfig) -> ChatClient | object:
    """Blocking; callers move to `await clotho.chat.models.build_model(config)`."""
    return ChatClient(config) if config.api == "chat" else _load_token_model(config)
