"""`clotho view --export`: one self-contained HTML file with the same views, for sharing.

The page is the web app's own (same CSS and JS, inlined); what the app would fetch from the
server is embedded as one JSON object keyed by the endpoint's path, so the JS answers its
requests from it. No server, no network: the file opens from disk in any browser.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from clotho.view.app import page
from clotho.view.sources import GroupsSource, RunSource, Source, discover


def snapshot(sources: list[Source], *, details: bool = True) -> dict[str, Any]:
    """Every endpoint's answer, by path (`details=False` leaves trial details out)."""
    routes: dict[str, Any] = {"/api/runs": [s.summary() for s in sources]}
    for source in sources:
        if isinstance(source, RunSource):
            base = f"/api/run/{source.id}"
            routes[base] = source.overview()
            routes[base + "/trials"] = source.trials()
            if details:  # by line, as the table numbers them (a line may be no valid record)
                for i in range(len(source.lines)):
                    routes[f"{base}/trial/{i}"] = source.detail(i)
        elif isinstance(source, GroupsSource):
            base = f"/api/groups/{source.id}"
            routes[base] = {"summary": source.summary(), "rows": source.group_rows()}
            for i in range(len(source.groups)):
                routes[f"{base}/group/{i}"] = source.group(i)
    return {"export": True, "routes": routes}


def _plain(sources: list[Source]) -> str:
    """What a reader without JavaScript (a mail preview, a text browser) still sees."""
    out = ["<p>This report needs JavaScript for its views; in short:</p><ul>"]
    for s in sources:
        if isinstance(s, RunSource):
            m = s.summary()
            rate = "-" if m["pass_rate"] is None else f"{100 * m['pass_rate']:.1f}%"
            stopped = ""
            if m["status"] == "stopped":
                planned = m["n_planned"]
                stopped = (
                    f" (stopped: {m['n_finished']} of {planned} attempts)"
                    if planned
                    else " (stopped)"
                )
            line = (
                f"run {s.path.name}{stopped}: pass rate {rate}, "
                f"{m['n_passed']}/{m['n_scored']} passed, {m['n']} attempts"
            )
            out.append(f"<li>{html.escape(line)}</li>")  # every field escaped, numbers too
        elif isinstance(s, GroupsSource):
            out.append(f"<li>groups {html.escape(s.path.name)}<ul>")
            for row in s.group_rows():
                scores = ", ".join(
                    f"rollout {j} score {score:g}" for j, score in enumerate(row["scores"])
                )
                group = f"group {row['i']}: {scores}"
                out.append(f"<li>{html.escape(group)}</li>")
            out.append("</ul></li>")
    return "".join(out) + "</ul>"


def render(sources: list[Source], *, details: bool = True) -> str:
    data = json.dumps(snapshot(sources, details=details), separators=(",", ":"))
    # Inside <script type="application/json"> no "<" may appear ("</script" would end the
    # element, "<!--" and "<script" change how the rest is parsed): JSON writes it \u003c.
    return page(data.replace("<", "\\u003c"), inline=True, noscript=_plain(sources))


def export_html(
    paths: list[Path], out: Path, *, details: bool = True, tokenizer: str | None = None
) -> int:
    """Write the report of these runs / group files to `out`; returns how many sources."""
    sources = discover(paths, tokenizer=tokenizer)
    text = render(sources, details=details)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return len(sources)


def write_groups_report(groups_file: Path, out: Path, stats: Any = None) -> None:
    """What `clotho process` writes beside its JSONL: the groups' stats (why groups were
    dropped) as `<file>.stats.json`, and the report of the file as `out`."""
    if stats is not None:
        dump = stats.model_dump(mode="json") if hasattr(stats, "model_dump") else stats
        source = GroupsSource("0", groups_file)
        source.stats_path.write_text(json.dumps(dump, indent=2) + "\n")
    export_html([groups_file], out)
