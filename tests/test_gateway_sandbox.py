"""The gateway reached from real sandboxes without network: a unix socket in the folder the
sandbox sees and the relay inside on 127.0.0.1. The run's model is `ScriptedOpenAIServer`,
the TEST DOUBLE of a hosted endpoint; sandboxes, sockets and HTTP are real."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import requires_docker
from tests.sandbox_fixtures import requires_bwrap
from tests.scripted_openai import Reply, ScriptedOpenAIServer, assistant, usage

from clotho.errors import TaskError
from clotho.gateway import Gateway, GatewayLimits, GatewayTrial
from clotho.gateway.channel import link_sandbox, socket_place
from clotho.sandbox.base import Sandbox
from clotho.sandbox.local.bwrap import BwrapSandbox

pytest_plugins = (
    "tests.sandbox_fixtures",  # bwrap_sandbox, docker_sandbox, root_mode
    "tests.gateway_fixtures",  # scripted, gateway
)

# What an agent in the sandbox runs: a stdlib HTTP client (the images have python3, not
# always curl). argv: URL, path, JSON body; the token comes from the environment.
CLIENT = r"""
import json, os, sys, urllib.request
url, path, body = sys.argv[1:4]
headers = {"Authorization": "Bearer " + os.environ["TOKEN"], "Content-Type": "application/json"}
request = urllib.request.Request(url + path, data=body.encode(), headers=headers)
try:
    reply = urllib.request.urlopen(request, timeout=60)
    print(reply.status)
    print(reply.read().decode())
except urllib.error.HTTPError as exc:
    print(exc.code)
    print(exc.read().decode())
"""


async def _call(
    sandbox: Sandbox,
    trial: GatewayTrial,
    url: str,
    path: str,
    body: dict[str, Any],
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    cmd = f"python3 -c {shlex.quote(CLIENT)} {url} {path} {shlex.quote(json.dumps(body))}"
    result = await sandbox.exec(cmd, env={"TOKEN": trial.token, **(env or {})}, timeout=120)
    assert result.exit_code == 0, result
    status, _, text = result.stdout.partition("\n")
    return int(status), text


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


@pytest.mark.bwrap
@requires_bwrap
async def test_local_sandbox_reaches_the_model_only_through_the_gateway(
    bwrap_sandbox: BwrapSandbox, gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [
        Reply(assistant("from the scripted model"), usage=usage(3, 4)),
        Reply(assistant("streamed answer"), usage=usage(5, 6)),
    ]
    trial = gateway.open_trial(GatewayLimits(max_turns=2))
    link = await link_sandbox(gateway, trial, bwrap_sandbox)
    assert link.socket_path.startswith("/.clotho/")

    status, text = await _call(bwrap_sandbox, trial, link.base_url, "/v1/chat/completions",
                               _chat("hello"))  # fmt: skip
    assert status == 200, text
    assert json.loads(text)["choices"][0]["message"]["content"] == "from the scripted model"

    messages = {"model": "c", "max_tokens": 9, "stream": True,
                "messages": [{"role": "user", "content": "stream it"}]}  # fmt: skip
    status, text = await _call(bwrap_sandbox, trial, link.base_url, "/v1/messages", messages)
    assert status == 200, text
    deltas = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert "".join(d["delta"].get("text", "") for d in deltas if "delta" in d) == (
        "streamed answer"
    )

    # The limit holds inside too; the sandbox's own network reaches nothing, the host's
    # loopback (where the model server listens) included.
    status, text = await _call(bwrap_sandbox, trial, link.base_url, "/v1/chat/completions",
                               _chat("one more"))  # fmt: skip
    assert status == 401 and "model-call limit" in text
    around = await bwrap_sandbox.exec(
        f"python3 -c {shlex.quote(CLIENT)} {scripted.base_url} /chat/completions '{{}}'",
        env={"TOKEN": trial.token},
        timeout=120,
    )
    assert around.exit_code != 0 and "Connection refused" in around.stderr, around
    assert len(scripted.requests) == 2


@pytest.mark.bwrap
@requires_bwrap
async def test_record_holds_what_the_sandboxed_agent_sent_and_received(
    bwrap_sandbox: BwrapSandbox, gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [Reply(assistant("the answer is 42"), usage=usage(7, 5))]
    trial = gateway.open_trial()
    link = await link_sandbox(gateway, trial, bwrap_sandbox)
    body = _chat("what is the answer?", temperature=0.1)
    status, text = await _call(bwrap_sandbox, trial, link.base_url, "/v1/chat/completions", body)
    assert status == 200
    record = gateway.close_trial(trial)
    [exchange] = record.exchanges
    assert exchange.request == body
    assert exchange.forwarded == body["messages"] == scripted.requests[0]["messages"]
    assert exchange.response == json.loads(text)
    assert record.usage.total_tokens == 12 and record.turns == 1
    # The socket belongs to the gateway: closing its listener removes it from the sandbox.
    place = socket_place(bwrap_sandbox)
    name = link.socket_path.rsplit("/", 1)[1]
    assert stat.S_ISSOCK(os.lstat(place.host_dir / name).st_mode)
    await gateway.close_listener(link.listener)
    assert not (place.host_dir / name).exists()


@pytest.mark.bwrap
@requires_bwrap
async def test_two_sandboxes_each_reach_their_own_trial(
    tmp_path: Path, gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    from clotho.sandbox import LocalSandboxConfig, open_sandbox

    scripted.default = assistant("ok")
    trials, links, boxes = [], [], []
    try:
        for i in range(2):
            config = LocalSandboxConfig(state_dir=str(tmp_path / f"s{i}"))
            boxes.append(await open_sandbox(config))
            trials.append(gateway.open_trial())
            links.append(await link_sandbox(gateway, trials[i], boxes[i]))
        for i in range(2):
            status, _ = await _call(boxes[i], trials[i], links[i].base_url,
                                    "/v1/chat/completions", _chat(f"from {i}"))  # fmt: skip
            assert status == 200
        # Sandbox 1 holding sandbox 0's token gets nothing from its own socket.
        status, text = await _call(boxes[1], trials[0], links[1].base_url,
                                   "/v1/chat/completions", _chat("stolen"))  # fmt: skip
        assert status == 401, text
    finally:
        for box in boxes:
            await box.close()
    assert [[e.request["messages"][0]["content"] for e in t.record.exchanges] for t in trials] == [
        ["from 0"],
        ["from 1"],
    ]


@pytest.mark.bwrap
@requires_bwrap
async def test_an_image_without_python3_or_node_is_a_task_error(
    bwrap_sandbox: BwrapSandbox, gateway: Gateway
) -> None:
    trial = gateway.open_trial()
    await bwrap_sandbox.exec("mkdir -p /tmp/bare && export PATH=/tmp/bare")
    with pytest.raises(TaskError, match="neither python3 nor node"):
        await link_sandbox(gateway, trial, bwrap_sandbox)
    socket_dir = socket_place(bwrap_sandbox).host_dir
    assert not [p for p in socket_dir.iterdir() if p.name.startswith("gw-")]


@pytest.mark.bwrap
@requires_bwrap
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed on the host")
async def test_node_relays_where_python3_is_missing(
    bwrap_sandbox: BwrapSandbox, gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [assistant("via node")]
    trial = gateway.open_trial()
    node, setsid = shutil.which("node"), shutil.which("setsid")
    await bwrap_sandbox.exec(
        f"mkdir -p /tmp/nodeonly && ln -s {node} {setsid} /tmp/nodeonly/ && "
        "export PATH=/tmp/nodeonly"
    )
    link = await link_sandbox(gateway, trial, bwrap_sandbox)
    relay = await bwrap_sandbox.exec("ps -eo args", env={"PATH": "/usr/bin:/bin"})
    assert "node -e" in relay.stdout and "python3 -c" not in relay.stdout
    status, text = await _call(bwrap_sandbox, trial, link.base_url, "/v1/chat/completions",
                               _chat("hi"), env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert status == 200 and "via node" in text


@requires_docker
async def test_docker_sandbox_reaches_the_gateway_through_its_fifo_folder(
    docker_sandbox: Any, gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [Reply(assistant("from the model, in docker"), usage=usage(2, 2))]
    trial = gateway.open_trial()
    link = await link_sandbox(gateway, trial, docker_sandbox)
    assert link.socket_path.startswith("/.clotho-io/")
    status, text = await _call(docker_sandbox, trial, link.base_url, "/v1/chat/completions",
                               _chat("hi"))  # fmt: skip
    assert status == 200, text
    assert "from the model, in docker" in text
    # The folder is mounted read-only: the agent cannot remove or replace the socket.
    removed = await docker_sandbox.exec(f"rm -f {link.socket_path}")
    assert removed.exit_code != 0
    assert trial.record.exchanges[0].request["messages"][0]["content"] == "hi"
