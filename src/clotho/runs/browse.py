"""A static HTML page to browse scored groups (what `clotho process` writes beside the JSONL)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from clotho.env.scored import ScoredGroup

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}
details{border:1px solid #ccc;border-radius:6px;margin:.6em 0;padding:.4em .8em}
summary{cursor:pointer;font-weight:600}
.msg{margin:.4em 0;padding:.4em .6em;border-left:4px solid #999;white-space:pre-wrap;font-family:monospace}
.system{border-color:#888}.user{border-color:#2a6}.assistant{border-color:#26c}.tool{border-color:#c82}
.score{float:right;font-weight:400}
"""


def _message(message: dict[str, Any]) -> str:
    role = str(message.get("role", "?"))
    parts = []
    if message.get("reasoning_content"):
        parts.append(f"[thinking]\n{message['reasoning_content']}")
    if message.get("content"):
        parts.append(str(message["content"]))
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        parts.append(f"[tool call] {fn.get('name')}({fn.get('arguments')})")
    body = html.escape("\n".join(parts))
    return f'<div class="msg {html.escape(role)}"><b>{html.escape(role)}</b>\n{body}</div>'


def render_groups(groups: list[ScoredGroup], title: str) -> str:
    out = [f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"]
    out.append(f"<style>{_STYLE}</style><h1>{html.escape(title)}</h1>")
    out.append(f"<p>{len(groups)} groups</p>")
    for gi, group in enumerate(groups):
        out.append(f"<details><summary>group {gi} <span class=score>scores "
                   f"{html.escape(json.dumps(group.scores))}</span></summary>")  # fmt: skip
        for ri, messages in enumerate(group.messages or []):
            trained = sum(m != -100 for m in group.masks[ri]) if group.masks else 0
            out.append(
                f"<details><summary>rollout {ri}: score {group.scores[ri]}, "
                f"{len(group.tokens[ri])} tokens, {trained} trained</summary>"
            )
            out.extend(_message(m) for m in messages)
            out.append("</details>")
        out.append("</details>")
    return "\n".join(out)


def write_browser(groups: list[ScoredGroup], path: Path, title: str) -> None:
    path.write_text(render_groups(groups, title))
