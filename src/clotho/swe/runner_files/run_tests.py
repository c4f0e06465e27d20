"""Run the listed pytest node ids and write JUnit XML; clotho's verifier runs this file.

argv: IDS_JSON JUNIT_XML. The ids come from a file (no command line limit, any characters);
pytest collects the files they name and keeps only the listed items, so an id that does not
exist is simply absent from the report (the verifier records it as not collected) instead
of stopping the run. Third-party plugins are not loaded (PYTEST_DISABLE_PLUGIN_AUTOLOAD).
"""

import json
import os
import sys

# Run with `python3 -I` (no PYTHONPATH, no user site, no script folder): our pytest first,
# then the repository (as SWE-bench's editable installs would put it).
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.getcwd()]
ids_path, junit_path = sys.argv[1], sys.argv[2]
with open(ids_path, encoding="utf-8") as handle:
    wanted = json.load(handle)
wanted_set = set(wanted)
files = [] if wanted else ["."]  # no ids: the whole suite (the generator's runs)
for node in wanted:
    path = node.split("::", 1)[0]
    if path and path not in files and os.path.exists(path):
        files.append(path)


class KeepListed:
    """Deselect every collected item that is not listed."""

    def pytest_collection_modifyitems(self, session, config, items):
        if not wanted:
            return
        keep = [item for item in items if item.nodeid in wanted_set]
        dropped = [item for item in items if item.nodeid not in wanted_set]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep


import pytest  # noqa: E402

if not files:
    with open(junit_path, "w", encoding="utf-8") as handle:
        handle.write('<?xml version="1.0"?><testsuites><testsuite tests="0"/></testsuites>')
    sys.exit(5)
args = [
    *files,
    f"--junitxml={junit_path}",
    "-o",
    "junit_family=xunit1",
    "-o",
    "addopts=",
    "-o",
    "console_output_style=classic",
    "--rootdir=.",
    "-p",
    "no:cacheprovider",
    "-p",
    "no:randomly",
    "--continue-on-collection-errors",
    "--color=no",
    "-q",
    "-rN",
    "--tb=short",
]
sys.exit(pytest.main(args, plugins=[KeepListed()]))
