"""OpenCode (npm `opencode-ai`): an open-source coding agent.

The pinned version's npm package for linux x64 (`opencode-linux-x64`) ships `opencode` as one
native executable (Bun with the app compiled in), linked to glibc (2.17 or newer): the
install keeps that file only, no Node. It runs as `opencode run` (headless, one message,
permissions auto-approved: the task's sandbox is the boundary) with its configuration in
`OPENCODE_CONFIG_CONTENT`: one provider, `clotho`, OpenAI Chat Completions at the gateway
(its bundled `@ai-sdk/openai-compatible`; nothing fetched), the trial's token as its key, and
nothing else reached (no update check, no sharing, no language-server downloads). Its JSON
event stream (`--format json`) is its trajectory; its own session data stays under
/logs/agent/opencode-home.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from clotho.installed_agents.base import AGENT_LOGS, AgentInstall, InstalledAgent, register_agent
from clotho.installed_agents.native import LOADER, check_glibc
from clotho.installed_agents.npm import npm_install
from clotho.sandbox.base import Sandbox

VERSION = "1.18.33"
MODEL = "gateway"
HOME = f"{AGENT_LOGS}/opencode-home"
MIN_GLIBC = (2, 17)


def _config(base_url: str) -> str:
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "clotho gateway",
        "options": {"baseURL": base_url, "apiKey": "{env:OPENAI_API_KEY}"},
        "models": {MODEL: {"name": MODEL, "tool_call": True}},
    }
    config = {
        "provider": {"clotho": provider},
        "model": f"clotho/{MODEL}",
        "small_model": f"clotho/{MODEL}",
        "enabled_providers": ["clotho"],
        "autoupdate": False,
        "share": "disabled",
        "permission": {"*": "allow"},
        "lsp": False,
        "formatter": False,
    }
    return json.dumps(config)


class OpenCode(InstalledAgent):
    name = "opencode"
    version = VERSION
    apis = ("openai-chat",)
    trajectory_file = "opencode.jsonl"
    needs_python = False

    async def prepare(self, python: str, cache_dir: Path) -> AgentInstall:
        return await npm_install(
            self.name,
            self.version,
            [f"opencode-linux-x64@{VERSION}"],
            {"opencode-linux-x64/bin/opencode": "bin/opencode"},
            cache_dir=cache_dir,
        )

    async def check_image(self, sandbox: Sandbox, *, loader: str = LOADER) -> None:
        """A `TaskError` naming what the image lacks for the native `opencode` binary."""
        await check_glibc(sandbox, self.name, MIN_GLIBC, loader=loader)

    def command(self, instruction: str, install_dir: str, workdir: str) -> str:
        argv = [
            f"{install_dir}/site/bin/opencode", "run", "--format", "json", "--auto",
            "--pure", "--model", f"clotho/{MODEL}", "--dir", workdir, "--", instruction,
        ]  # fmt: skip
        return (
            f"mkdir -p {HOME} && cd {shlex.quote(workdir)} && "
            f"{shlex.join(argv)} </dev/null > {self.trajectory_path}"
        )

    def env(self, gateway_env: dict[str, str], install_dir: str) -> dict[str, str]:
        return {
            **gateway_env,
            "OPENCODE_CONFIG_CONTENT": _config(gateway_env["OPENAI_BASE_URL"]),
            "HOME": HOME,
            "XDG_DATA_HOME": f"{HOME}/data",
            "XDG_CONFIG_HOME": f"{HOME}/config",
            "XDG_CACHE_HOME": f"{HOME}/cache",
            "XDG_STATE_HOME": f"{HOME}/state",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "NO_COLOR": "1",
        }


register_agent(OpenCode.name, OpenCode)
