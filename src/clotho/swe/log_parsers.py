"""Per-test outcomes read from a test runner's console log, for runners that write no JUnit
XML: one function per log format, registered by name (a repository spec names its parser).

The formats and their quirks follow what the SWE-bench and SWE-smith harnesses parse, so a
record's FAIL_TO_PASS / PASS_TO_PASS ids (which those parsers produced) are found under the
same keys. Each parser maps test id -> status (PASSED, FAILED, ERROR, SKIPPED, XFAIL); a test
seen more than once keeps its worst status. A listed test a parser does not find is not
collected, which the verifier scores as failed, as it does with JUnit.
"""

from __future__ import annotations

import re
from collections.abc import Callable

STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL")
_WORST = {"ERROR": 4, "FAILED": 3, "SKIPPED": 2, "XFAIL": 1, "PASSED": 0}
# SWE-bench's reading: a test passed when it PASSED or XFAILed (an expected failure).
OUTCOME = {
    "PASSED": "passed",
    "XFAIL": "passed",
    "FAILED": "failed",
    "ERROR": "error",
    "SKIPPED": "skipped",
}
_SKIP_COUNT = re.compile(r"^\[\d+\]$")  # `SKIPPED [3] file.py:12: reason`: [3] is no test
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\[(\d+)m")
_CONTROL = str.maketrans("", "", "".join(chr(c) for c in range(1, 32) if c != 9))

LogParser = Callable[[str], dict[str, str]]
PARSERS: dict[str, LogParser] = {}


def _put(found: dict[str, str], test: str, status: str) -> None:
    if test and _WORST[status] >= _WORST.get(found.get(test, "PASSED"), 0):
        found[test] = status


def parser(*names: str) -> Callable[[LogParser], LogParser]:
    def register(fn: LogParser) -> LogParser:
        for name in names:
            PARSERS[name] = fn
        return fn

    return register


def get_parser(name: str) -> LogParser:
    """The parser registered as `name` (SWE-bench's `parse_log_<name>` spelling works too);
    an unknown name is a `KeyError` listing the known ones."""
    key = name.removeprefix("parse_log_")
    if key not in PARSERS:
        raise KeyError(f"unknown log parser {name!r}; known: {', '.join(sorted(PARSERS))}")
    return PARSERS[key]


def parse_log(name: str, log: str) -> dict[str, str]:
    return get_parser(name)(log)


def _summary_line(line: str) -> tuple[str, list[str]] | None:
    """(status, words) of a `pytest -rA` short-summary line, else None."""
    status = next((s for s in STATUSES if line.startswith(s)), None)
    if status is None:
        return None
    words = line.split()
    if len(words) < 2 or words[0] != status:
        return None
    if status == "SKIPPED" and _SKIP_COUNT.match(words[1]):
        return None
    return status, words


def _pytest_summary(log: str, normalize: Callable[[str], str] | None = None) -> dict[str, str]:
    """`pytest -rA`: `PASSED id`, `FAILED id - message`. The id is the first word (as the
    reference harness reads it, so ids cut at a space match its lists) and also the whole
    rest of the line before ` - ` (parametrized ids with spaces)."""
    found: dict[str, str] = {}
    for line in log.splitlines():
        parsed = _summary_line(line)
        if parsed is None:
            continue
        status, words = parsed
        first = normalize(words[1]) if normalize else words[1]
        _put(found, first, status)
        whole = line[len(status) :].strip()
        if status in ("FAILED", "ERROR", "XFAIL"):
            whole = whole.split(" - ", 1)[0].strip()
        if whole != words[1]:
            _put(found, normalize(whole) if normalize else whole, status)
    return found


@parser(
    "pytest", "astroid", "flask", "marshmallow", "pvlib", "pyvista", "sqlfluff", "xarray"
)  # fmt: skip
def parse_pytest(log: str) -> dict[str, str]:
    """`pytest -rA` short test summary lines."""
    return _pytest_summary(log)


_OPTION = re.compile(r"(.*?)\[(.*)\]$")


def _short_option(test: str) -> str:
    """A parameter that is an absolute path keeps its last part only (`[/tmp/x/a.txt]` ->
    `[/a.txt]`): the reference lists were made on another machine's paths."""
    match = _OPTION.match(test)
    if not match:
        return test
    main, option = match.groups()
    if option.startswith("/") and not option.startswith("//") and "*" not in option:
        option = "/" + option.split("/")[-1]
    return f"{main}[{option}]"


@parser("pytest_options", "requests", "pylint", "pydicom")
def parse_pytest_options(log: str) -> dict[str, str]:
    """`pytest -rA`, parameters that are absolute paths shortened to their file name."""
    return _pytest_summary(log, _short_option)


@parser("pytest_v2", "astropy", "scikit", "sphinx")
def parse_pytest_v2(log: str) -> dict[str, str]:
    """`pytest -rA` of newer pytest (colour codes stripped, ids may hold spaces) and the
    older `id STATUS` verbose lines (`-vv`, tox's output)."""
    found: dict[str, str] = {}
    for raw in log.splitlines():
        line = _ANSI.sub("", raw).translate(_CONTROL)
        parsed = _summary_line(line)
        if parsed is not None:
            status, _ = parsed
            rest = line[len(status) :]
            if status == "FAILED":
                rest = rest.split(" - ", 1)[0]
            _put(found, " ".join(rest.split()), status)
            continue
        status = next((s for s in STATUSES if line.endswith(s)), None)
        words = line.split()
        if status is not None and len(words) >= 2 and words[-1] == status:
            _put(found, " ".join(words[:-1]), status)
    return found


@parser("matplotlib")
def parse_matplotlib(log: str) -> dict[str, str]:
    """`pytest -rA` with enum parameters spelled as their values (`MouseButton.LEFT` -> 1)."""
    log = log.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3")
    return _pytest_summary(log)


@parser("seaborn")
def parse_seaborn(log: str) -> dict[str, str]:
    """`pytest -rA` summary lines and `id PASSED [ 10%]` verbose lines."""
    found: dict[str, str] = {}
    for line in log.splitlines():
        words = line.split()
        if len(words) < 2:
            continue
        if line.startswith("FAILED"):
            _put(found, words[1], "FAILED")
        elif " PASSED " in line and words[1] == "PASSED":
            _put(found, words[0], "PASSED")
        elif line.startswith("PASSED"):
            _put(found, words[1], "PASSED")
    return found


_SYMPY_HEADER = re.compile(r"(_*) (.*)\.py:(.*) (_*)")


@parser("sympy")
def parse_sympy(log: str) -> dict[str, str]:
    """sympy's `bin/test --verbose`: `test_name ok`, `test_name F`, `test_name E`, and the
    `____ path.py:test_name ____` headers of the failure reports."""
    found: dict[str, str] = {}
    for match in _SYMPY_HEADER.findall(log):
        _put(found, f"{match[1]}.py:{match[2]}", "FAILED")
    for raw in log.splitlines():
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        test = line.split()[0]
        if line.endswith(" E"):
            _put(found, test, "ERROR")
        elif line.endswith(" F"):
            _put(found, test, "FAILED")
        elif line.endswith(" ok"):
            _put(found, test, "PASSED")
    return found


_DJANGO_PASS = (" ... ok", " ... OK", " ...  OK")
# Django's runner sometimes prints between a test's name and its `ok`.
_DJANGO_SPLIT = (
    re.compile(r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$", re.M),
    re.compile(r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$", re.M),
    re.compile(r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$", re.M),
)  # fmt: skip


@parser("django")
def parse_django(log: str) -> dict[str, str]:
    """Django's `runtests.py --verbosity 2`: `test_x (module.Class) ... ok|FAIL|ERROR|
    skipped '...'`, the `FAIL: test_x (...)` report headers, and an `ok` on a later line."""
    found: dict[str, str] = {}
    previous: str | None = None
    for raw in log.splitlines():
        line = raw.strip()
        if "--version is equivalent to version" in line:
            _put(found, "--version is equivalent to version", "PASSED")
        if " ... " in line:
            previous = line.split(" ... ")[0]
        for suffix in _DJANGO_PASS:
            if line.endswith(suffix):
                if line.startswith("Applying sites.0002_alter_domain_unique...test_no_migrations"):
                    line = line.split("...", 1)[-1].strip()
                _put(found, line.rsplit(suffix, 1)[0], "PASSED")
                break
        if " ... skipped" in line:
            _put(found, line.split(" ... skipped")[0], "SKIPPED")
        if line.endswith(" ... FAIL"):
            _put(found, line.split(" ... FAIL")[0], "FAILED")
        if line.startswith("FAIL:") and len(line.split()) > 1:
            _put(found, line.split()[1], "FAILED")
        if line.endswith(" ... ERROR"):
            _put(found, line.split(" ... ERROR")[0], "ERROR")
        if line.startswith("ERROR:") and len(line.split()) > 1:
            _put(found, line.split()[1], "ERROR")
        if line.startswith("ok") and previous is not None:
            _put(found, previous, "PASSED")
    for pattern in _DJANGO_SPLIT:
        for match in pattern.finditer(log):
            _put(found, match.group(1), "PASSED")
    return found


@parser("unittest")
def parse_unittest(log: str) -> dict[str, str]:
    """`python -m unittest -v` style: `test_x (module.Class) ... ok|FAIL|ERROR|skipped`,
    and `FAIL: test_x (module.Class)` report headers (SWE-smith's tornado, python-slugify)."""
    found: dict[str, str] = {}
    for raw in log.splitlines():
        line = raw.rstrip()
        if " ... " in line:
            test, _, verdict = line.partition(" ... ")
            verdict = verdict.strip()
            if verdict == "ok":
                _put(found, test, "PASSED")
            elif verdict.startswith("skipped"):
                _put(found, test, "SKIPPED")
            elif verdict == "expected failure":
                _put(found, test, "XFAIL")
            elif verdict in ("FAIL", "unexpected success"):
                _put(found, test, "FAILED")
            elif verdict == "ERROR":
                _put(found, test, "ERROR")
        elif line.startswith(("FAIL: ", "ERROR: ")):
            kind, _, test = line.partition(": ")
            _put(found, test.strip(), "FAILED" if kind == "FAIL" else "ERROR")
    return found


_VERBOSE = re.compile(r"^(\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL)\b")
_VERBOSE_WHOLE = re.compile(r"^(.+?)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL)(\s+\[\s*\d+%\])?\s*$")


@parser("pytest_verbose")
def parse_pytest_verbose(log: str) -> dict[str, str]:
    """`pytest --verbose` progress lines, `tests/x.py::test_a PASSED [ 10%]` (SWE-smith's
    default): the first word, and the whole id when it holds spaces."""
    found: dict[str, str] = {}
    for line in log.splitlines():
        match = _VERBOSE.match(line)
        if match:
            _put(found, match.group(1), match.group(2))
        whole = _VERBOSE_WHOLE.match(line)
        if whole and whole.group(1) != (match.group(1) if match else None):
            _put(found, whole.group(1), whole.group(2))
    return found


_XDIST = re.compile(r"^\[gw\d+\]\s(PASSED|FAILED|SKIPPED|ERROR|XFAIL)\s(\S+)")


@parser("pytest_xdist")
def parse_pytest_xdist(log: str) -> dict[str, str]:
    """`pytest -n N --verbose`: `[gw0] PASSED tests/x.py::test_a`."""
    found: dict[str, str] = {}
    for line in log.splitlines():
        match = _XDIST.match(line)
        if match:
            _put(found, match.group(2), match.group(1))
    return found
