# transitional: removed once env/runs import from clotho.chat
from clotho.chat.models import per_rollout  # noqa: F401
from clotho.chat.token_model import ContextFull, TokenChatSession, TokenModel  # noqa: F401
