"""The `ssh` sandbox backend: sandboxes on a machine reached over SSH (extra `ssh`).

Importing the package registers its config (`config.py`); the backend itself
(`backend.py`, asyncssh) is imported on first use."""

from clotho.sandbox.ssh.config import SshSandboxConfig

__all__ = ["SshSandboxConfig"]
