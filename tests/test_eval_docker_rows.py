"""Docker-built environments from TB2 rows (a Dockerfile inside environment_tar, or a
`docker_image`) and from a compose file's main service."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_eval_docker import _docker_answers, clotho, pytestmark, results  # noqa: F401
from tests.test_tasks_rows import CHECK, b64_tar, row

DOCKERFILE = "FROM clotho/base:bookworm\nWORKDIR /app\nCOPY data.txt /app/data.txt\n"


def test_rows_with_dockerfile_and_docker_image(tmp_path: Path) -> None:
    rows = tmp_path / "tb2.jsonl"
    built = row("built", environment_tar=b64_tar({"Dockerfile": DOCKERFILE, "data.txt": "seeded"}))
    # A row whose image exists locally runs without a build; its tests see no data.txt.
    prebuilt = row("prebuilt", docker_image="clotho/base:bookworm", environment_tar=b64_tar({}))
    rows.write_text(json.dumps(built) + "\n" + json.dumps(prebuilt) + "\n")
    out = tmp_path / "run"
    proc = clotho(
        "eval", str(rows), "--agent", "nop", "--sandbox", "docker", "--out", str(out),
        env={"XDG_CACHE_HOME": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    by_task = {r["task"]: r for r in results(out)}
    assert by_task["built"]["reward"] == 1.0, by_task["built"]
    assert by_task["prebuilt"]["reward"] == 0.0 and by_task["prebuilt"]["error"] is None


def test_compose_main_service_is_built(make_task, tmp_path: Path) -> None:
    make_task(
        "composed",
        test_sh=CHECK,
        env_files={
            "docker-compose.yaml": "services:\n  client:\n    build:\n      context: ./image\n"
            "      dockerfile: Containerfile\n",
            "image/Containerfile": DOCKERFILE,
            "image/data.txt": "seeded",
        },
    )
    out = tmp_path / "run"
    proc = clotho(
        "eval", str(tmp_path / "tasks"), "--agent", "nop", "--sandbox", "docker", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    (record,) = results(out)
    assert record["reward"] == 1.0, record
