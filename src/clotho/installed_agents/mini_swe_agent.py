"""mini-swe-agent (PyPI `mini-swe-agent`): a bash-only agent loop over litellm.

Installed with its dependencies pinned, except `datasets` and `textual` (the SWE-bench batch
runner and the interactive inspector: a headless `mini` run imports neither, and with them the
install is twice the size: pyarrow, pandas, numpy). It runs as `python3 -m
minisweagent.run.mini` in yolo mode on the task's instruction, exits when it submits, talks
OpenAI Chat Completions through litellm's `openai/` provider (OPENAI_BASE_URL, OPENAI_API_KEY:
the gateway and the trial's token), and writes its own trajectory (`-o`) to
/logs/agent/mini-swe-agent.traj.json.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from clotho.installed_agents.base import (
    AgentInstall,
    InstalledAgent,
    pip_install,
    register_agent,
)

VERSION = "2.4.6"
# Its own requirements, pinned (datasets and textual left out, see above); what they pull in
# is recorded in the install's stamp.
REQUIREMENTS = [
    "litellm==1.110.2",
    "openai==3.57.0",
    "pydantic==2.14.4",
    "jinja2==3.1.6",
    "pyyaml==6.0.4",
    "requests==2.34.2",
    "tenacity==9.2.1",
    "rich==15.0.0",
    "python-dotenv==1.2.4",
    "typer==0.29.2",
    "platformdirs==4.14.8",
    "prompt_toolkit==3.0.53",
]


class MiniSweAgent(InstalledAgent):
    name = "mini-swe-agent"
    version = VERSION
    apis = ("openai-chat",)
    trajectory_file = "mini-swe-agent.traj.json"

    async def prepare(self, python: str, cache_dir: Path) -> AgentInstall:
        return await pip_install(
            self.name,
            self.version,
            REQUIREMENTS,
            python=python,
            cache_dir=cache_dir,
            no_deps=[f"mini-swe-agent=={VERSION}"],
        )

    def command(self, instruction: str, install_dir: str, workdir: str) -> str:
        argv = [
            "python3", "-m", "minisweagent.run.mini", "--yolo", "--exit-immediately",
            "--model", "openai/clotho-gateway", "--cost-limit", "0",
            "--config", "mini.yaml", "--output", self.trajectory_path,
            "--task", instruction,
        ]  # fmt: skip
        return f"cd {shlex.quote(workdir)} && {shlex.join(argv)} </dev/null"

    def env(self, gateway_env: dict[str, str], install_dir: str) -> dict[str, str]:
        return {
            **gateway_env,
            "PYTHONPATH": f"{install_dir}/site",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MSWEA_CONFIGURED": "true",  # no first-run setup prompt
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",  # the gateway's model has no price list
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of litellm's price list
            "LITELLM_LOG": "ERROR",
        }


register_agent(MiniSweAgent.name, MiniSweAgent)
