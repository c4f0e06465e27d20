"""The `ray` backend: sandboxes on every node of a Ray cluster (extra `ray`).

`RayBackend` (`backend.py`) keeps one `SandboxHost` actor per node (`host.py`), which runs
that node's sandboxes through the ordinary backends; `RaySandbox` (`proxy.py`) is the
driver's handle on one. Ray itself is imported only when the backend first connects.
"""

from clotho.sandbox.ray.backend import HostLost, RayBackend
from clotho.sandbox.ray.proxy import RaySandbox

__all__ = ["HostLost", "RayBackend", "RaySandbox"]
