"""`clotho bench view`: how fast `clotho view` opens a big run (10,000 trials by default).

A run directory is generated (records, details, config, metrics: the real models), then:

- server: the first answer of /api/run/ID and /api/run/ID/trials (results.jsonl read and
  parsed cold, metrics computed), in process, and an append of 100 lines read again;
- browser: headless Chromium (Debian's) opens the run's page on a real `clotho view` server
  (which has read its runs, as it does in the background when it starts; the page opened
  while it starts is measured too); the time from navigation start until the table shows
  its first page of the 10,000 rows,
  taken in the page by a MutationObserver (DevTools' addScriptToEvaluateOnNewDocument), so
  the harness's polling adds nothing; then a trial's detail view, opened by a click;
- export: the time to write the one-file report without details, and its size.

The browser part is skipped (and said so) when Chromium or Selenium is missing.
"""

from __future__ import annotations

import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from clotho.view.sample import append_trials, write_run
from clotho.view.sources import RunSource

OPEN_TARGET_MS = 1000.0

_PROBE = """
window.__clotho_bench = {};
new MutationObserver(() => {
  const info = document.getElementById('page-info');
  if (info && /of %d\\b/.test(info.textContent) && !window.__clotho_bench.table_ms)
    window.__clotho_bench.table_ms = performance.now();
  if (document.getElementById('conversation') && !window.__clotho_bench.trial_ms)
    window.__clotho_bench.trial_ms = performance.now();
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


class ViewBench(BaseModel):
    trials: int
    results_mb: float
    server_cold_ms: float
    server_append_100_ms: float
    browser_open_ms: list[float] | None = None
    browser_open_median_ms: float | None = None
    browser_rows_fetched_ms: float | None = None
    browser_open_cold_ms: float | None = None
    browser_trial_ms: float | None = None
    browser_skipped: str | None = None
    export_ms: float
    export_mb: float
    target_open_ms: float = OPEN_TARGET_MS
    target_met: bool | None = None


def _serve(app: Any) -> tuple[Any, threading.Thread, int]:
    """The app served on a loopback port of its own: the socket is bound here and handed to
    the server, so no other process can take the port in between."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=_run_closing, args=(server, sock), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the view server did not start")
        time.sleep(0.02)
    return server, thread, port


def _run_closing(server: Any, sock: socket.socket) -> None:
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


def _wait(driver: Any, script: str, what: str) -> Any:
    deadline = time.monotonic() + 60
    while not (value := driver.execute_script(script)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not show")
        time.sleep(0.01)
    return value


_ROWS_FETCHED = """return performance.getEntriesByType('resource')
  .filter(e => e.name.includes('/trials?')).map(e => e.responseEnd)[0]"""


def _browser(root: Path, n: int, repeats: int) -> dict[str, Any]:
    from clotho.view.app import create_app
    from clotho.view.browser import chromium
    from clotho.view.sources import discover

    opens: list[float] = []
    fetched: list[float] = []
    out: dict[str, Any] = {}
    with chromium(1400, 900) as driver:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _PROBE % n})
        for cold in (True, *([False] * repeats)):
            # a fresh server each time; `cold`: the page is opened before the server has
            # read the run (it reads its sources in the background as it starts)
            sources = discover([root])
            if not cold:
                for source in sources:
                    source.summary()
            server, thread, port = _serve(create_app(sources))
            try:
                driver.get(f"http://127.0.0.1:{port}/#/run/0")
                table_ms = _wait(driver, "return window.__clotho_bench.table_ms", "the table")
                if cold:
                    out["cold"] = table_ms
                    continue
                opens.append(table_ms)
                fetched.append(driver.execute_script(_ROWS_FETCHED))
                start = driver.execute_script("return performance.now()")
                driver.find_element("css selector", "#trials tr.trial-row td:nth-child(2)").click()
                trial = _wait(driver, "return window.__clotho_bench.trial_ms", "the trial")
                out["trial"] = trial - start
            finally:
                server.should_exit = True
                thread.join(10)
    return {**out, "opens": opens, "fetched": statistics.median(fetched)}


def run_view_bench(n: int = 10_000, repeats: int = 3, browser: bool = True) -> ViewBench:
    from clotho.view.export import export_html

    with tempfile.TemporaryDirectory(prefix="clotho-view-bench-") as tmp:
        root = write_run(Path(tmp) / "big", n, attempts=1, seed=7)
        results_mb = (root / "results.jsonl").stat().st_size / 1e6

        colds = []
        for _ in range(repeats):
            source = RunSource("0", root)
            start = time.perf_counter()
            source.overview()
            source.trials(0)
            colds.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        append_trials(root, n, 100)
        source.trials(n)
        append_ms = (time.perf_counter() - start) * 1000

        out = Path(tmp) / "report.html"
        start = time.perf_counter()
        export_html([root], out, details=False)
        export_ms = (time.perf_counter() - start) * 1000

        result = ViewBench(
            trials=n,
            results_mb=round(results_mb, 2),
            server_cold_ms=round(statistics.median(colds), 1),
            server_append_100_ms=round(append_ms, 2),
            export_ms=round(export_ms, 1),
            export_mb=round(out.stat().st_size / 1e6, 2),
        )
        if not browser:
            result.browser_skipped = "--no-browser"
            return result
        try:
            figures = _browser(root, n + 100, repeats)
        except Exception as exc:  # no Chromium, no Selenium: the server figures still stand
            result.browser_skipped = f"{type(exc).__name__}: {exc}"
            return result
        result.browser_open_ms = [round(x, 1) for x in figures["opens"]]
        result.browser_open_median_ms = round(statistics.median(figures["opens"]), 1)
        result.browser_rows_fetched_ms = round(figures["fetched"], 1)
        result.browser_open_cold_ms = round(figures["cold"], 1)
        result.browser_trial_ms = round(figures["trial"], 1)
        result.target_met = result.browser_open_median_ms < OPEN_TARGET_MS
        return result


def view_bench_command(
    trials: Annotated[int, typer.Option(min=1, help="trials in the generated run")] = 10_000,
    repeats: Annotated[int, typer.Option(min=1, help="times each figure is taken")] = 3,
    browser: Annotated[
        bool, typer.Option("--browser/--no-browser", help="measure in headless Chromium")
    ] = True,
    json_out: Annotated[bool, typer.Option("--json", help="print the figures as JSON")] = False,
) -> None:
    """How fast `clotho view` opens a run of 10,000 trials (server, browser, export)."""
    result = run_view_bench(trials, repeats, browser)
    if json_out:
        print(json.dumps(result.model_dump(), indent=2))
        return
    table = Table(title=f"clotho view: a run of {trials:,} trials")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("results.jsonl (MB)", f"{result.results_mb:g}")
    table.add_row("server: first run + rows answer, cold (ms)", f"{result.server_cold_ms:g}")
    table.add_row("server: read 100 appended lines (ms)", f"{result.server_append_100_ms:g}")
    if result.browser_open_median_ms is not None:
        mark = "[green]ok" if result.target_met else "[red]missed"
        table.add_row(
            "browser: navigation -> table shown, median (ms)",
            f"{result.browser_open_median_ms:g} (< {OPEN_TARGET_MS:g} {mark}[/])",
        )
        table.add_row("  of which: rows received (ms)", f"{result.browser_rows_fetched_ms:g}")
        table.add_row(
            "browser: opened as the server starts (cold index) (ms)",
            f"{result.browser_open_cold_ms:g}",
        )
        table.add_row("browser: click -> trial shown (ms)", f"{result.browser_trial_ms:g}")
    else:
        table.add_row("browser", f"skipped: {result.browser_skipped}")
    table.add_row(
        "export without details (ms / MB)", f"{result.export_ms:g} / {result.export_mb:g}"
    )
    Console().print(table)
