"""`clotho eval --resume` never lowers isolation on a run folder's word.

A run folder is anyone's to edit. A config.json changed to the unsafe-local sandbox (or to
network access, or limits off) is refused on resume until the command line asks for the
same again; with the flag given again the run goes on.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import requires_bwrap
from tests.support import run_clotho as clotho


def edit(config: Path, **changes: object) -> None:
    data = json.loads(config.read_text())
    data.update(changes)
    config.write_text(json.dumps(data))


@requires_bwrap
def test_a_config_edited_to_unsafe_local_needs_the_flag_again(make_task, tmp_path: Path) -> None:
    marker = tmp_path / "solution-ran-on-the-host"
    make_task(
        "hostile",
        # Under bubblewrap the host's tmp_path is out of reach; on the host it is written.
        solve_sh=f"echo ok > done.txt; echo ran >> {marker} 2>/dev/null || true\n",
        test_sh=(
            "mkdir -p /logs/verifier\n"
            'if [ "$(cat done.txt)" = ok ]; then echo 1; else echo 0; fi'
            " > /logs/verifier/reward.txt\n"
        ),
    )
    tasks, out = str(tmp_path / "tasks"), tmp_path / "run"
    first = clotho("eval", tasks, "--agent", "oracle", "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert not marker.exists()  # the local sandbox kept the solution off the host

    # Someone edits the folder: unsafe-local, and one more attempt to run.
    edit(out / "config.json", sandbox={"backend": "unsafe-local"}, attempts=2)
    refused = clotho("eval", "--out", str(out), "--resume")
    assert refused.returncode != 0
    message = " ".join(refused.stderr.split())
    assert 'sandbox.backend="unsafe-local"' in message, message
    assert "give --sandbox unsafe-local again" in message, message
    assert "Traceback" not in refused.stderr
    assert not marker.exists()
    assert len((out / "results.jsonl").read_text().splitlines()) == 1  # nothing ran

    # The user asks for it again: the run goes on, on the host.
    again = clotho("eval", "--out", str(out), "--resume", "--sandbox", "unsafe-local")
    assert again.returncode == 0, again.stderr
    assert marker.read_text() == "ran\n"
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["attempt"] for r in lines) == [0, 1]


def saved_run(tmp_path: Path, sandbox: dict) -> Path:
    """A run folder holding only a config.json (nothing ran yet)."""
    out = tmp_path / "run"
    out.mkdir()
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    config = {"schema_version": 1, "paths": [str(tasks)], "agent": "nop", "sandbox": sandbox}
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_network_and_a_nested_unsafe_local_are_refused_too(tmp_path: Path) -> None:
    out = saved_run(tmp_path, {"backend": "local", "network": True, "cgroup_limits": False})
    refused = clotho("eval", "--out", str(out), "--resume")
    message = " ".join(refused.stderr.split())
    assert refused.returncode != 0
    assert "--network" in message and "--set sandbox.cgroup_limits=false" in message, message
    assert "unsafe-local runs" not in message

    nested = tmp_path / "nested"
    nested.mkdir()
    out = saved_run(
        nested, {"backend": "ray", "address": "auto", "inner": {"backend": "unsafe-local"}}
    )
    refused = clotho("eval", "--out", str(out), "--resume")
    message = " ".join(refused.stderr.split())
    assert refused.returncode != 0
    assert "sandbox.inner.backend" in message and "--sandbox unsafe-local" in message, message


def test_the_default_isolation_resumes_without_flags(tmp_path: Path) -> None:
    """Nothing lowered: no refusal of this kind (the empty task folder is its own error)."""
    out = saved_run(tmp_path, {"backend": "local"})
    result = clotho("eval", "--out", str(out), "--resume")
    assert "less isolation" not in result.stderr
