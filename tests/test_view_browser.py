"""`clotho view` in a real browser: headless Chromium (Debian's packages) driven by Selenium,
clicking through runs -> run -> trial -> compare, the groups and the export, on generated runs.

Screenshots are checked for their key elements: each element is on screen and its pixels
show what it is for (the category pass bars are green, trained tokens are highlighted).
With CLOTHO_VIEW_SCREENSHOTS=DIR the screenshots are kept there (docs/ has them).
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.real_tokenizers import QWEN_DIR
from tests.support import port_open, wait_for_value, wait_until_sync
from tests.test_view_guard import HOSTILE, TOKEN, hostile_run

from clotho.view.browser import chromium, find_chromium
from clotho.view.export import export_html
from clotho.view.sample import append_trials, write_groups, write_run

pytestmark = pytest.mark.skipif(
    find_chromium() is None and os.environ.get("CI") != "true",
    reason="chromium and chromium-driver are not installed (make test installs them)",
)

PASS_GREEN = (0x1A, 0x7F, 0x37)
TRAINED = (0xFF, 0xE9, 0xA8)
PHASE_AGENT = (0x24, 0x57, 0xC5)
DASH = "\u2013"  # what the page shows for a number it does not have


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA PNG: enough to look."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows = zlib.decompress(idat), width * channels, []
    prev = bytearray(stride)
    for y in range(height):
        filt, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b, c = prev[x], prev[x - channels] if x >= channels else 0
            if filt == 1:
                line[x] = (line[x] + a) & 255
            elif filt == 2:
                line[x] = (line[x] + b) & 255
            elif filt == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif filt == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, channels, rows


def has_colour(png: bytes, rgb: tuple[int, int, int], tolerance: int = 6) -> bool:
    _, channels, rows = png_pixels(png)
    for row in rows:
        for x in range(0, len(row), channels):
            if all(abs(row[x + i] - rgb[i]) <= tolerance for i in range(3)):
                return True
    return False


def colours(png: bytes) -> int:
    _, channels, rows = png_pixels(png)
    return len({row[x : x + 3] for row in rows[::4] for x in range(0, len(row), channels * 4)})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("view") / "runs"
    # token sequences are the conversations in Qwen3's tokens, so they read as text
    write_run(root / "qwen3-8b", 240, seed=1, attempts=2, tokenizer=QWEN_DIR)
    write_run(root / "qwen3-8b-sft", 240, seed=2, attempts=2, pass_prob=0.8, finished=False)
    write_groups(root / "groups.jsonl", 4, tokenizer=QWEN_DIR)
    return root


@contextmanager
def view_server(*args: str) -> Iterator[str]:
    """`clotho view ARGS` as a user starts it: a free port, printed; its URL."""
    environ = {k: v for k, v in os.environ.items() if k != "CLOTHO_VIEW_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "clotho.cli.main", "view", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, f"no address printed: {line!r}"
        port = int(match.group(1))
        assert wait_until_sync(lambda: port_open(port)), "clotho view never listened"
        yield match.group(0)
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def server(runs: Path) -> Iterator[str]:
    with view_server(str(runs), "--tokenizer", str(QWEN_DIR)) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium(1400, 900) as driver:
        yield driver


def wait(condition: Callable[[], Any], timeout: float = 10.0) -> Any:
    return wait_for_value(condition, timeout)


def css(driver: Any, selector: str) -> list[Any]:
    return driver.find_elements("css selector", selector)


def shot(driver: Any, name: str) -> bytes:
    png = driver.get_screenshot_as_png()
    keep = os.environ.get("CLOTHO_VIEW_SCREENSHOTS")
    if keep:
        Path(keep, f"view-{name}.png").write_bytes(png)
    return png


def on_screen(driver: Any, selector: str) -> Any:
    element = wait(lambda: css(driver, selector) and css(driver, selector)[0])
    assert element.is_displayed(), selector
    rect, height = element.rect, driver.execute_script("return window.innerHeight")
    assert rect["y"] < height and rect["height"] > 0, f"{selector} is not in the screenshot"
    return element


def test_runs_run_trial_compare(browser: Any, server: str, runs: Path) -> None:
    d = browser
    d.get(server)
    rows = wait(lambda: css(d, "#runs tr.run-row"))
    assert len(rows) == 2
    assert "qwen3-8b-sft" in rows[1].text and "running" in rows[1].text
    assert re.search(r"\d+\.\d%\s+\[\d+\.\d%, \d+\.\d%\]", rows[0].text)  # rate and interval
    on_screen(d, "#group-files")
    png = shot(d, "runs")
    assert colours(png) > 8

    # a run: summary, per category, pass@k, phase timings, a page of the table
    css(d, "#runs tr.run-row a")[0].click()
    wait(lambda: len(css(d, "#trials tr.trial-row")) == 100)
    assert "100 of 240" in d.find_element("id", "page-info").text
    for selector in ("#pass-rate", "#categories table", "#passk table", "#timings table"):
        on_screen(d, selector)
    assert "pass@2" in d.find_element("id", "passk").text
    png = shot(d, "run")
    assert has_colour(png, PASS_GREEN)  # the per-category pass bars

    # sort by duration, descending on the second click
    header = next(th for th in css(d, "#trials th") if th.text.startswith("duration"))
    header.click()
    header = next(th for th in css(d, "#trials th") if th.text.startswith("duration"))
    header.click()
    durations = [
        float(r.find_elements("tag name", "td")[8].text.split()[0])
        for r in css(d, "#trials tr.trial-row")[:5]
    ]
    assert durations == sorted(durations, reverse=True)

    # filter: a category, then failed ones, then a search
    from selenium.webdriver.support.ui import Select

    Select(d.find_element("id", "f-category")).select_by_index(1)
    category = Select(d.find_element("id", "f-category")).first_selected_option.text
    cats = {r.find_elements("tag name", "td")[1].text for r in css(d, "#trials tr.trial-row")}
    assert cats == {category}
    Select(d.find_element("id", "f-status")).select_by_value("failed")
    outcomes = {r.find_elements("tag name", "td")[4].text for r in css(d, "#trials tr.trial-row")}
    assert outcomes == {"fail"}
    Select(d.find_element("id", "f-category")).select_by_index(0)
    Select(d.find_element("id", "f-status")).select_by_value("")
    d.find_element("id", "f-search").send_keys("task-00006")  # its attempt 0 has a long tool output
    wait(lambda: len(css(d, "#trials tr.trial-row")) == 2)
    assert "(filtered from 240)" in d.find_element("id", "page-info").text

    # a trial: conversation with its tool calls, folded output, verifier's tests, tokens, timings
    row = [
        r
        for r in css(d, "#trials tr.trial-row")
        if r.find_elements("tag name", "td")[2].text == "0"
    ]
    row[0].find_elements("tag name", "td")[2].click()  # the row, not its link
    on_screen(d, "#trial-header")
    msgs = css(d, "#conversation .msg")
    assert [m.get_attribute("class").split()[1] for m in msgs[:4]] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assert "terminal" in d.find_element("css selector", "#conversation .call").text
    fold = css(d, "#conversation .msg.tool details.fold")
    assert fold, "the long tool output is folded"
    assert "file_79.txt" not in fold[0].text
    fold[0].find_element("tag name", "summary").click()
    wait(lambda: "file_79.txt" in fold[0].text)
    tests = css(d, "#tests tr")
    assert any("test_content" in t.text for t in tests)
    on_screen(d, "#phase-timings")
    png = shot(d, "trial")
    assert has_colour(png, PHASE_AGENT)  # the phase bar's agent segment
    token = d.find_element("css selector", "#tokens .tok.trained")
    assert "logprob -" in token.get_attribute("title")
    sequence = d.find_element("css selector", "#tokens .tokens.text").text
    assert "<|im_start|>assistant" in sequence and "Let me look at the workspace" in sequence
    d.execute_script("arguments[0].scrollIntoView()", d.find_element("id", "tokens"))
    png = shot(d, "tokens")
    assert has_colour(png, TRAINED)

    # in-page jumps keep the route; j/k (or the arrows) step through the filtered table
    here = d.current_url
    d.execute_script("window.scrollTo(0, 0)")
    d.find_element("css selector", 'button.jump[data-jump="verifier"]').click()
    assert d.current_url == here and css(d, "#trial-header")
    step = css(d, "#next-trial") or css(d, "#prev-trial")  # the other attempt, either side
    key = "j" if step[0].get_attribute("id") == "next-trial" else "k"
    d.find_element("tag name", "body").send_keys(key)
    wait(lambda: d.current_url != here)
    wait(lambda: "task-00006 attempt 1" in css(d, "#app h1")[0].text)

    # compare: pick both runs on the runs page
    d.find_element("css selector", "#crumbs a").click()
    for box in wait(lambda: css(d, "#runs .pick")):
        box.click()
    d.find_element("id", "compare").click()
    diff = on_screen(d, "#diff-rate")
    assert re.fullmatch(r"[+-]?\d+\.\d pts", diff.text)
    assert "95% interval [" in d.find_element("id", "compare-summary").text
    categories = css(d, "#compare-categories tbody tr")
    assert len(categories) == 6 and all(re.search(r"pts", r.text) for r in categories)
    flipped = css(d, "#flipped tbody tr")
    assert flipped and {r.get_attribute("class") for r in flipped} <= {"fixed", "broke"}
    shot(d, "compare")


def test_a_run_still_writing_updates_without_a_reload(
    browser: Any, server: str, runs: Path
) -> None:
    d = browser
    d.get(server + "#/run/2")  # ids: groups.jsonl 0, qwen3-8b 1, qwen3-8b-sft 2
    wait(lambda: "of 240" in d.find_element("id", "page-info").text)
    d.execute_script("window.__same_page = true")
    append_trials(runs / "qwen3-8b-sft", 500, 7)
    wait(lambda: "of 247" in d.find_element("id", "page-info").text, timeout=15)
    assert d.execute_script("return window.__same_page") is True
    assert "live" in d.find_element("id", "live").text

    d.find_element("css selector", "#crumbs a").click()  # the runs page follows too
    row = wait(lambda: css(d, '#runs tr.run-row[data-id="2"]'))[0]
    assert "(247 attempts)" in row.text
    append_trials(runs / "qwen3-8b-sft", 600, 5)
    wait(lambda: "(252 attempts)" in css(d, '#runs tr.run-row[data-id="2"]')[0].text, timeout=15)
    assert d.execute_script("return window.__same_page") is True


def test_groups_side_by_side_with_why_groups_were_dropped(browser: Any, server: str) -> None:
    d = browser
    d.get(server)
    wait(lambda: css(d, "#group-files a"))[0].click()
    dropped = on_screen(d, "#dropped")
    assert "all scores equal (no signal)" in dropped.text
    wait(lambda: css(d, "#groups tr.group-row a"))[0].click()
    rollouts = wait(lambda: css(d, ".rollouts .rollout"))
    assert len(rollouts) == 4
    xs = [r.rect["x"] for r in rollouts]
    assert xs == sorted(xs) and len(set(xs)) == 4  # side by side, not stacked
    png = shot(d, "group")
    assert has_colour(png, PASS_GREEN)


def test_the_export_works_from_a_file(browser: Any, runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "clotho.cli.main",
            "view",
            str(runs / "qwen3-8b"),
            "--export",
            str(out),
        ],
        check=True,
    )
    d = browser
    d.get_log("browser")  # what earlier pages logged is theirs
    d.get(out.as_uri())
    wait(lambda: css(d, "#runs tr.run-row a"))[0].click()
    wait(lambda: len(css(d, "#trials tr.trial-row")) == 100)
    css(d, "#trials tr.trial-row a")[0].click()
    on_screen(d, "#conversation")
    assert css(d, "#tests tr")
    resources = d.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert resources == []  # nothing fetched: the file holds everything
    logs = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not logs, logs


def assert_inert(d: Any, where: str) -> None:
    """No markup from the files became an element, and none of it ran."""
    assert d.execute_script("return window.__pwned") is None, where
    assert not css(d, 'img[src="x"]'), where


def walk_hostile(d: Any, base: str) -> None:
    """Every view of the hostile run and group file, each checked for injected markup."""
    d.get(base)
    wait(lambda: css(d, "#runs tr.run-row"))
    assert_inert(d, "runs")
    d.get(base + "#/run/0")
    wait(lambda: len(css(d, "#trials tr.trial-row")) == 2)
    # markup where a number belongs is shown as text, or as a dash, never as an element
    assert HOSTILE in d.find_element("id", "run-summary").text  # the config's concurrency
    cells = css(d, "#trials tr.trial-row")[0].find_elements("tag name", "td")
    assert [cells[i].text for i in (2, 3, 6, 7, 8)] == [DASH] * 5
    assert_inert(d, "run")
    for n in (0, 1):  # the raw record (not a valid trial), the hostile detail file
        d.get(base + f"#/run/0/trial/{n}")
        on_screen(d, "#trial-header")
        assert_inert(d, f"trial {n}")
    assert f"exit code {DASH}" in d.find_element("id", "verifier").text
    d.get(base + "#/groups/1")
    wait(lambda: css(d, "#groups tr.group-row"))
    d.get(base + "#/groups/1/group/0")
    wait(lambda: css(d, ".rollouts .rollout"))
    assert_inert(d, "group")
    # a link whose route carries markup: the crumbs it lands in keep it text
    d.get(base + "#/groups/1%3F%22%3E%3Cimg%20src%3Dx%20onerror%3D__pwned%3D1%3E/group/0")
    wait(lambda: css(d, "#app p.error") or css(d, ".rollouts"))
    assert_inert(d, "a crafted route")


def test_markup_in_any_field_stays_text_served_and_exported(browser: Any, tmp_path: Path) -> None:
    """Numbers included: `turns`, `attempt`, a verifier's exit code, a config's concurrency.
    The export has no Content-Security-Policy to fall back on: escaping alone keeps it inert."""
    root = hostile_run(tmp_path / "runs")
    with view_server(str(root)) as url:
        walk_hostile(browser, url)
    out = tmp_path / "report.html"
    export_html([root], out)
    walk_hostile(browser, out.as_uri())


def test_a_browser_reads_a_viewer_with_a_token(browser: Any, runs: Path, tmp_path: Path) -> None:
    """The token as HTTP Basic credentials: the page and every request it makes carry it."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    with view_server(str(runs), "--token-file", str(token_file)) as url:
        d = browser
        d.get(url)
        assert not css(d, "#runs tr.run-row")  # refused: 401 without the token
        d.get(url.replace("http://", f"http://anyone:{TOKEN}@"))
        rows = wait(lambda: css(d, "#runs tr.run-row"))
        assert len(rows) == 2
        css(d, "#runs tr.run-row a")[0].click()
        wait(lambda: len(css(d, "#trials tr.trial-row")) == 100)
