"""The model gateway: third-party agents reach the run's model through it, recorded exactly.

`Gateway` (server.py) speaks OpenAI Chat Completions and Anthropic Messages and forwards to
the run's `ModelSession`; `GatewayTrial` is one trial's token, budget and `GatewayRecord`;
`channel.py` makes it reachable from a sandbox without network (a unix socket in a folder the
sandbox sees, and a relay inside on 127.0.0.1).
"""

from clotho.gateway.record import (
    ExchangeError,
    GatewayExchange,
    GatewayLimits,
    GatewayRecord,
)
from clotho.gateway.server import Gateway, GatewayTrial, Listener

__all__ = [
    "ExchangeError",
    "Gateway",
    "GatewayExchange",
    "GatewayLimits",
    "GatewayRecord",
    "GatewayTrial",
    "Listener",
]
