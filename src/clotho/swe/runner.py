"""What the verifier brings into the sandbox after the agent: pytest (from this Python's own
installation, so no image needs it and no agent could have changed it), the script that
runs the listed tests, and how JUnit XML becomes one outcome per listed test id."""

from __future__ import annotations

import functools
import posixpath
import py_compile
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

RUNNER_SCRIPT = Path(__file__).with_name("runner_files") / "run_tests.py"
# Distributions pytest needs at run time.
PYTEST_DISTS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")
# pytest imports these of pygments' 9 MB (it colours nothing with --color=no).
PYGMENTS_SUBMODULES = {
    f"pygments/{name}.py"
    for name in (
        "lexers/__init__", "lexers/_mapping", "lexers/diff", "lexers/python",
        "formatters/__init__", "formatters/_mapping", "formatters/terminal",
        "styles/__init__", "styles/_mapping", "filters/__init__",
    )
}  # fmt: skip


@functools.cache
def runner_files() -> dict[str, bytes]:
    """{relative path: bytes} of pytest's packages and the runner script (read once)."""
    files: dict[str, bytes] = {"run_tests.py": RUNNER_SCRIPT.read_bytes()}
    for dist in PYTEST_DISTS:
        for entry in metadata.files(dist) or ():
            rel = str(entry)
            if rel.endswith(".pyc") or ".dist-info" in rel or rel.startswith(".."):
                continue
            if not rel.endswith((".py", ".typed")):
                continue
            if (
                rel.count("/") > 1
                and rel.startswith("pygments/")
                and rel not in PYGMENTS_SUBMODULES
            ):
                continue
            files[rel] = Path(str(entry.locate())).read_bytes()
    files.update(_bytecode(files))
    return files


def _bytecode(files: dict[str, bytes]) -> dict[str, bytes]:
    """Unchecked hash-based .pyc files of the modules (PEP 552), made once by this Python:
    the tests run with PYTHONDONTWRITEBYTECODE, so without them every verification compiled
    pytest again (150 ms of a 370 ms test run here). A sandbox Python of another version sees a
    different magic number and compiles the source as before."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return {}
    compiled: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="clotho-pyc-") as tmp:
        for rel, source in files.items():
            if not rel.endswith(".py") or rel == "run_tests.py":
                continue
            folder, name = posixpath.split(rel)
            target = Path(tmp) / f"{len(compiled)}.pyc"
            try:
                py_compile.compile(
                    _write(Path(tmp) / "src.py", source),
                    cfile=str(target),
                    dfile=rel,
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                )
            except py_compile.PyCompileError:
                continue
            pyc = posixpath.join(folder, "__pycache__", f"{name[:-3]}.{tag}.pyc")
            compiled[pyc] = target.read_bytes()
    return compiled


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@dataclass
class TestCase:
    ids: set[str]
    outcome: str  # passed | failed | error | skipped
    message: str = ""
    text: str = ""  # the traceback, for failures and errors
    nodeid: str = ""  # pytest's, when the report has xunit1's `file`


def _module_path(file: str) -> str:
    return file.removesuffix(".py").replace("/", ".")


def parse_junit(xml: str) -> list[TestCase]:
    """Every <testcase>, with the ids it may be listed under: pytest's node id (rebuilt from
    xunit1's `file` and `classname`), `classname::name`, `classname.name` and `name`."""
    root = ET.fromstring(xml)  # our own runner wrote it; the reader capped its size
    cases: list[TestCase] = []
    for case in root.iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname", "")
        ids = {name, f"{classname}::{name}", f"{classname}.{name}"}
        nodeid = f"{classname}::{name}"
        file = case.get("file")
        if file:
            module = _module_path(file)
            rest = classname[len(module) :].lstrip(".") if classname.startswith(module) else ""
            parts = [file, *(p for p in rest.split(".") if p), name]
            nodeid = "::".join(parts)
            ids.add(nodeid)
        outcome, message, text = "passed", "", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
                message = (child.get("message") or child.text or "")[:2000]
                text = (child.text or "")[-4000:]
                break
            if child.tag == "skipped":
                kind = child.get("type", "")
                outcome = "passed" if kind == "pytest.xfail" else "skipped"
                message = (child.get("message") or "")[:500]
        cases.append(TestCase(ids=ids, outcome=outcome, message=message, text=text, nodeid=nodeid))
    return cases


_RANK = {"error": 3, "failed": 2, "skipped": 1, "passed": 0}


def outcomes(listed: list[str], cases: list[TestCase]) -> dict[str, dict[str, str]]:
    """Per listed id: its outcome (the worst over its report entries: a teardown error after
    a pass is an error) or `not collected`."""
    by_id: dict[str, TestCase] = {}
    for case in cases:
        for key in case.ids:
            known = by_id.get(key)
            if known is None or _RANK[case.outcome] > _RANK[known.outcome]:
                by_id[key] = case
    result: dict[str, dict[str, str]] = {}
    for test in listed:
        case = by_id.get(test)
        if case is None:
            result[test] = {"outcome": "not collected"}
        else:
            entry = {"outcome": case.outcome}
            if case.message:
                entry["message"] = case.message
            result[test] = entry
    return result
