"""`clotho view`: a local web app over run directories and scored-group files, and its
self-contained HTML export."""

from clotho.view.export import export_html, write_groups_report
from clotho.view.sources import GroupsSource, RunSource, discover

__all__ = ["GroupsSource", "RunSource", "discover", "export_html", "write_groups_report"]
