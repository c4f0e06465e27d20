"""The page of scored groups `clotho process` used to write: now `clotho view`'s export.

Kept for callers with a list of groups in hand; `clotho process` calls
`clotho.view.export.write_groups_report` on its JSONL file instead.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from clotho.env.scored import ScoredGroup


def write_browser(groups: list[ScoredGroup], path: Path, title: str | None = None) -> None:
    """The report of these groups (`clotho view --export`'s page); `title` names the file."""
    from clotho.view.export import export_html

    with tempfile.TemporaryDirectory(prefix="clotho-groups-") as tmp:
        name = (title or path.stem).replace("/", "_").replace(":", "") or "groups"
        source = Path(tmp) / f"{name}.jsonl"
        source.write_text("".join(g.model_dump_json() + "\n" for g in groups))
        export_html([source], path)
