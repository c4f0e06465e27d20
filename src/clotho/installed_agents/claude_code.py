"""Claude Code (npm `@anthropic-ai/claude-code`): Anthropic's coding agent.

The pinned version's npm package for linux x64 (`@anthropic-ai/claude-code-linux-x64`) ships
`claude` as one native executable (the JavaScript runtime compiled in), so no Node is needed:
the install keeps that file only. It is linked against glibc (2.26 or newer: the loader
/lib64/ld-linux-x86-64.so.2 and libc, libm, libpthread, libdl, librt), so it runs in any
glibc-based image of the last years; an image without glibc (Alpine's musl, a distroless
static image) or with an older one is the task's error, said before anything runs
(`check_image`). It runs as `claude -p` (headless, one prompt), permission prompts skipped
(the task's sandbox is the boundary), on the Messages API at the gateway (`ANTHROPIC_BASE_URL`,
the trial's token in `ANTHROPIC_API_KEY`); its `stream-json` output is its trajectory, and its
own session files stay in its config folder under /logs/agent/claude-home.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from clotho.installed_agents.base import AGENT_LOGS, AgentInstall, InstalledAgent, register_agent
from clotho.installed_agents.native import LOADER, check_glibc
from clotho.installed_agents.npm import npm_install
from clotho.sandbox.base import Sandbox

VERSION = "2.1.332"
MODEL = "claude-sonnet-4-5"  # the name it sends; the run's model configuration decides
CLAUDE_HOME = f"{AGENT_LOGS}/claude-home"
MIN_GLIBC = (2, 26)


class ClaudeCode(InstalledAgent):
    name = "claude-code"
    version = VERSION
    apis = ("anthropic-messages",)
    trajectory_file = "claude-code.jsonl"
    needs_python = False

    async def prepare(self, python: str, cache_dir: Path) -> AgentInstall:
        return await npm_install(
            self.name,
            self.version,
            [f"@anthropic-ai/claude-code-linux-x64@{VERSION}"],
            {"@anthropic-ai/claude-code-linux-x64/claude": "bin/claude"},
            cache_dir=cache_dir,
        )

    async def check_image(self, sandbox: Sandbox, *, loader: str = LOADER) -> None:
        """A `TaskError` naming what the image lacks for the native `claude` binary."""
        await check_glibc(sandbox, self.name, MIN_GLIBC, loader=loader)

    def command(self, instruction: str, install_dir: str, workdir: str) -> str:
        argv = [
            f"{install_dir}/site/bin/claude", "-p", instruction,
            "--output-format", "stream-json", "--verbose",
            "--dangerously-skip-permissions", "--model", MODEL,
        ]  # fmt: skip
        return (
            f"mkdir -p {CLAUDE_HOME} && cd {shlex.quote(workdir)} && "
            f"{shlex.join(argv)} </dev/null > {self.trajectory_path}"
        )

    def env(self, gateway_env: dict[str, str], install_dir: str) -> dict[str, str]:
        return {
            **gateway_env,
            "CLAUDE_CONFIG_DIR": CLAUDE_HOME,
            "IS_SANDBOX": "1",  # permission prompts may be skipped as root: a sandbox
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "NO_COLOR": "1",
        }


register_agent(ClaudeCode.name, ClaudeCode)
