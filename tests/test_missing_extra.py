"""A backend whose SDK is not installed is refused before the first rollout, naming the extra
to install: `clotho process --ray ADDRESS` without Ray was 16 infra errors and exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import requires_bwrap
from tests.real_tokenizers import QWEN_DIR
from tests.scripted_openai import ScriptedOpenAIServer, assistant

pytestmark = requires_bwrap


def test_ray_without_its_extra_is_refused_up_front(tmp_path: Path) -> None:
    # Python's own way to make a module not importable: None in sys.modules, set at start-up
    # (a stand-in for an install without the ray extra; Ray itself is installed here).
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None\n")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with ScriptedOpenAIServer(default=assistant("done")) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "clotho", "process", "terminal_test",
             "--out", str(tmp_path / "g.jsonl"), "--n-groups", "1", "--model", "m",
             "--base-url", server.base_url, "--tokenizer", str(QWEN_DIR),
             "--ray", "127.0.0.1:1"],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert server.requests == []
    stderr = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'clotho-rl[ray]'" in stderr
