"""The `ssh` sandbox kind: sandboxes on a machine reached over SSH (extra `ssh`: asyncssh).

Registered by its entry point (pyproject.toml, `clotho.sandbox_kinds`), so `--sandbox ssh`, `clotho sandbox ls/gc`
and the docs read it from the registry. Where the sandbox runs is the remote machine: none
of its processes run on this host, so the kind counts as isolated from the harness; how
it is isolated on the remote host (bubblewrap, or nothing when the host has none) is each
sandbox's stated fact (`SshSandbox.facts`), said once at run time too.

Fields left unset are read from `CLOTHO_SSH_HOST`, `CLOTHO_SSH_PORT`, `CLOTHO_SSH_USER`,
`CLOTHO_SSH_KEY`, `CLOTHO_SSH_KNOWN_HOSTS` and `CLOTHO_SSH_ROOT`, so `clotho sandbox ls/gc` finds a configured
host's leftovers without a flag of its own.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from clotho.sandbox.config import Place, SandboxConfigBase

if TYPE_CHECKING:
    from clotho.sandbox.backends import SandboxBackend

ENV_PREFIX = "CLOTHO_SSH_"


def _env(name: str) -> str | None:
    return os.environ.get(ENV_PREFIX + name) or None


class SshSandboxConfig(SandboxConfigBase):
    """One sandbox per SSH connection to `host`: a persistent shell, files over SFTP, a
    folder of its own under `remote_root`, bubblewrap on the remote host when it has it."""

    backend: Literal["ssh"] = "ssh"
    backend_class: ClassVar[str] = "clotho.sandbox.ssh.backend:SshBackend"
    sdk: ClassVar[tuple[str, str] | None] = ("asyncssh", "ssh")
    place: ClassVar[Place] = "host"  # chosen with --sandbox like the host kinds
    # Nothing of the sandbox runs on this host; the remote host's isolation is a fact of
    # each sandbox (bubblewrap or none), never assumed.
    isolated: ClassVar[bool] = True
    no_network_hint: ClassVar[str] = (
        "(a Harbor task's [environment] allow_internet = true) and this run gives its "
        "sandboxes none: --set sandbox.network=true (the remote host's own network, unguarded)"
    )

    host: str | None = Field(
        default_factory=lambda: _env("HOST"), description="remote host (CLOTHO_SSH_HOST)"
    )
    port: int = Field(
        default_factory=lambda: int(_env("PORT") or 22), gt=0, lt=65536, description="SSH port"
    )
    user: str | None = Field(
        default_factory=lambda: _env("USER"),
        description="remote user (default: this user's name); a non-root user is safer: "
        "the sandbox's root is that user",
    )
    key_file: str | None = Field(
        default_factory=lambda: _env("KEY"),
        description="private key file (default: the SSH agent and ~/.ssh's default keys)",
    )
    known_hosts: str | None = Field(
        default_factory=lambda: _env("KNOWN_HOSTS"),
        description="known-hosts file the host key must be in (default: ~/.ssh/known_hosts)",
    )
    check_host_key: bool = Field(
        True,
        description="refuse a host whose key is not in known_hosts; false accepts any key "
        "(a machine in the middle could then run the sandboxes): an explicit opt-out",
    )
    connect_timeout_s: float = Field(20.0, gt=0)
    connect_concurrency: int = Field(
        8,
        ge=1,
        description="SSH handshakes at once from this run (sshd's MaxStartups drops "
        "unauthenticated connections beyond 10 by default)",
    )
    remote_root: str | None = Field(
        default_factory=lambda: _env("ROOT"),
        description="clotho's folder on the remote host, one sub-folder per sandbox "
        "(CLOTHO_SSH_ROOT; default: ~/.clotho-ssh of the remote user)",
    )
    isolation: Literal["auto", "bwrap", "none"] = Field(
        "auto",
        description="auto: bubblewrap when the remote host has a working one, else plain "
        "processes of the remote user (said at run time and in the sandbox's facts); bwrap: "
        "refused without it; none: never",
    )
    workdir: str = Field(
        "/app",
        description="the workspace inside a bubblewrap sandbox; without bubblewrap the "
        "workspace is the sandbox's remote folder itself",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    max_output_bytes: int = Field(8 << 20, description="per stream; the middle is dropped beyond")
    shell: Literal["session", "isolated"] = "session"
    network: bool = Field(
        False,
        description="bubblewrap: share the remote host's network (unguarded: its own "
        "services are reachable); false: none. Without bubblewrap it is always the host's",
    )
    memory_mb: int | None = Field(
        None, gt=0, description="address space per process (ulimit -v), not a cgroup"
    )
    pids_limit: int | None = Field(
        None,
        gt=0,
        description="processes of the remote user at once (ulimit -u): shared by every "
        "sandbox of that user, so size it for all of them",
    )
    file_size_mb: int | None = Field(
        None, gt=0, description="the largest file a sandbox process may write (ulimit -f)"
    )
    state_dir: str | None = Field(None, description="unused: the state lives on the remote host")

    @model_validator(mode="after")
    def _known_hosts_unless_opted_out(self) -> SshSandboxConfig:
        if self.check_host_key and self.known_hosts is None:
            self.known_hosts = "~/.ssh/known_hosts"
        return self

    def new_backend(self, *, docker_url: str | None = None) -> SandboxBackend:
        return self.backend_type()(self)

    def backend_key(self, *, docker_url: str | None = None) -> str:
        return f"ssh {self.user or ''}@{self.host}:{self.port} {self.remote_root or ''}"

    @classmethod
    def listing(cls, state_dir: str | None) -> SandboxConfigBase | None:
        """The host named by CLOTHO_SSH_HOST (and its fellows), when one is."""
        config = cls()
        return config if config.host else None

    @property
    def own_root(self) -> bool:
        return False

    def install_facts(self) -> dict[str, Any]:
        return {**super().install_facts(), "root": f"ssh:{self.host}"}

    def with_task_network(self, wants: bool, task: str) -> SshSandboxConfig:
        if self.isolation == "none":  # the remote host's own network, whatever anyone says
            return self
        return super().with_task_network(wants, task)
