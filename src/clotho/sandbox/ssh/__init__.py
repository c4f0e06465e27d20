"""The `ssh` sandbox backend: sandboxes on a machine reached over SSH (extra `ssh`).

Its config (`config.py`) is registered by its entry point; the backend itself
(`backend.py`, asyncssh) is imported on first use."""

from clotho.sandbox.ssh.config import SshSandboxConfig

__all__ = ["SshSandboxConfig"]
