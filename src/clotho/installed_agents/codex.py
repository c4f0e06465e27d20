"""Codex CLI (npm `@openai/codex`): OpenAI's coding agent, a Rust binary.

Its npm package for linux x64 ships `codex` as a static (musl, static-pie) executable, so it
runs in any x86-64 Linux image, whatever its libc, with no Node: the install keeps that binary
and the `rg` it puts on its PATH, nothing else. It runs as `codex exec` (headless) with
approvals and its own sandbox off (the task's sandbox is the boundary; codex's would need
namespaces the sandbox does not give), on a model provider of its own config named `clotho`
that speaks the Responses API at the gateway (`OPENAI_BASE_URL`, the trial's token in
`OPENAI_API_KEY`). Its event stream (`--json`) is its trajectory, and its session files stay
in its home under /logs/agent/codex-home.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from clotho.installed_agents.base import AGENT_LOGS, AgentInstall, InstalledAgent, register_agent
from clotho.installed_agents.npm import npm_install

VERSION = "0.171.0"
_VENDOR = "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl"
# The model name codex is told; the run's model configuration decides the real one.
MODEL = "clotho-gateway"
CODEX_HOME = f"{AGENT_LOGS}/codex-home"


def _config() -> list[str]:
    """`-c` overrides: the gateway as a Responses-API provider, nothing else reached."""
    settings = {
        "model_provider": '"clotho"',
        "model_providers.clotho.name": '"clotho gateway"',
        "model_providers.clotho.base_url": '"$OPENAI_BASE_URL"',
        "model_providers.clotho.env_key": '"OPENAI_API_KEY"',
        "model_providers.clotho.wire_api": '"responses"',
        "model_providers.clotho.request_max_retries": "1",
        "model_providers.clotho.stream_max_retries": "1",
        "check_for_update_on_startup": "false",
        "analytics.enabled": "false",
        "feedback.enabled": "false",
        "shell_environment_policy.inherit": '"all"',
    }
    argv: list[str] = []
    for key, value in settings.items():
        # Double quotes around the pair so the shell expands $OPENAI_BASE_URL inside it.
        argv += ["-c", f'"{key}={value.replace(chr(34), chr(92) + chr(34))}"']
    return argv


class Codex(InstalledAgent):
    name = "codex"
    version = VERSION
    apis = ("openai-responses",)
    trajectory_file = "codex.jsonl"
    needs_python = False

    async def prepare(self, python: str, cache_dir: Path) -> AgentInstall:
        return await npm_install(
            self.name,
            self.version,
            [f"@openai/codex@{VERSION}"],
            {f"{_VENDOR}/bin/codex": "bin/codex", f"{_VENDOR}/codex-path/rg": "path/rg"},
            cache_dir=cache_dir,
        )

    def command(self, instruction: str, install_dir: str, workdir: str) -> str:
        site = f"{install_dir}/site"
        argv = [
            "exec", "--json", "--skip-git-repo-check", "--color", "never",
            "--dangerously-bypass-approvals-and-sandbox", "--model", MODEL,
            "--cd", workdir, "--output-last-message", f"{AGENT_LOGS}/codex-last-message.txt",
        ]  # fmt: skip
        return (
            f"mkdir -p {CODEX_HOME} && cd {shlex.quote(workdir)} && "
            f"PATH={shlex.quote(site + '/path')}:$PATH "
            f"{shlex.quote(site + '/bin/codex')} {shlex.join(argv)} {' '.join(_config())} "
            f"-- {shlex.quote(instruction)} </dev/null > {self.trajectory_path}"
        )

    def env(self, gateway_env: dict[str, str], install_dir: str) -> dict[str, str]:
        return {**gateway_env, "CODEX_HOME": CODEX_HOME, "RUST_LOG": "error", "NO_COLOR": "1"}


register_agent(Codex.name, Codex)
