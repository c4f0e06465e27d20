"""The `browser` toolset: a headless Chromium inside the rollout's sandbox, driven from the host.

Where the browser runs decides what it can reach, so it runs where the agent does: Chromium is
started *inside* the sandbox (by `browser_launch`, with the image's `python3`), as a process of
the sandbox. It sees the sandbox's files (file:///app/page.html) and the sandbox's network
only: none on a sandbox without network (its own loopback, where a server the agent starts
answers), the guarded one where the task allows internet. The host's own services are out of
its reach exactly as they are out of the agent's. The host drives it over the DevTools pipe,
carried by a unix socket the host listens on in a folder the sandbox already sees (the model
gateway's place, `gateway.channel.socket_place`); no TCP port is opened on either side.

One browser per rollout: started at the first browser call in a sandbox, gone with it (the
agent's processes are stopped before the tests, and closing the sandbox kills what is left).
An image without Chromium or python3 gets a clear error at that call.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import shlex
import socket
import stat
import weakref
from pathlib import Path
from typing import Any

from clotho.errors import ConfigError
from clotho.sandbox.base import Sandbox
from clotho.tools import browser_launch
from clotho.tools.browser_cdp import MAX_MESSAGE, CdpConnection, CdpError
from clotho.tools.runtime import ToolFailure, ToolRuntime, truncate_middle
from clotho.tools.tool import tool

NO_PYTHON_EXIT = 97
NO_CHROMIUM_EXIT = 98
START_TIMEOUT_S = 120.0  # a failure bound: Chromium starts in seconds, slower on a busy host
ACTION_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 30.0
VIEWPORT = (1280, 800)

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",  # the sandbox is the isolation; Chromium's own needs namespaces it lacks
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-breakpad",
    "--mute-audio",
    "--remote-debugging-pipe",
    f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
]

_PAGE_JS = (Path(__file__).parent / "browser_page.js").read_text()


def launch_command(socket_path: str) -> str:
    """Shell: find python3 and Chromium, start the launcher in its own session, print its line."""
    source = Path(browser_launch.__file__).read_text().split('"""', 2)[2]
    flags = " ".join(shlex.quote(f) for f in CHROMIUM_FLAGS)
    # Debian's /usr/bin/chromium is a wrapper that sources /etc/chromium.d, which a sandbox's
    # own /etc lacks: the binary behind it first.
    find = (
        "B=; for c in /usr/lib/chromium/chromium chromium chromium-browser google-chrome "
        'headless_shell; do B=$(command -v "$c" 2>/dev/null) && break; B=; done'
    )
    launcher = (
        f'python3 -c {shlex.quote(source)} {shlex.quote(socket_path)} "$B" {flags} '
        '"--user-data-dir=$D" about:blank'
    )
    return (
        f"command -v python3 >/dev/null 2>&1 || exit {NO_PYTHON_EXIT}\n"
        f'{find}\n[ -n "$B" ] || exit {NO_CHROMIUM_EXIT}\n'
        'D=$(mktemp -d "${TMPDIR:-/tmp}/clotho-browser.XXXXXX") || exit 1\n'
        f"( S=$(command -v setsid || true); $S {launcher} </dev/null 2>&1 & ) | "
        '( IFS= read -r line; printf "%s\\n" "$line" )'
    )


class _Listener:
    """A unix socket bound through the folder's fd (no link followed), for one connection."""

    def __init__(self, folder: Path, owner_uid: int | None, mode: int | None) -> None:
        self.name = f"br-{secrets.token_hex(8)}.sock"
        self._fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server: asyncio.Server | None = None
        self.accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.get_running_loop().create_future()
        )
        try:
            self._sock.bind(f"/proc/self/fd/{self._fd}/{self.name}")
            info = os.stat(self.name, dir_fd=self._fd, follow_symlinks=False)
            if not stat.S_ISSOCK(info.st_mode):
                raise OSError(f"{self.name} is not the socket just bound")
            if owner_uid is not None:
                os.chown(self.name, owner_uid, owner_uid, dir_fd=self._fd, follow_symlinks=False)
            if mode is not None:
                os.chmod(self.name, mode, dir_fd=self._fd)
        except BaseException:
            self.close()
            raise

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(
            self._connected, sock=self._sock, limit=MAX_MESSAGE
        )

    def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.accepted.done():
            writer.close()  # one connection: the launcher's
            return
        self.accepted.set_result((reader, writer))

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        else:
            self._sock.close()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.name, dir_fd=self._fd)
            os.close(self._fd)
            self._fd = -1


class BrowserSession:
    """One Chromium, one browser context and one page, driven over CDP."""

    def __init__(self, conn: CdpConnection, session: str, context: str) -> None:
        self.conn = conn
        self.session = session
        self.context = context
        self.frame_id: str | None = None
        # The main frame's navigation state, from its events: `seq` counts every navigation
        # asked for or started; `pending` is a navigation asked for and not yet loading;
        # `loading` holds from its start until it stopped (a failed one never says it stopped:
        # the navigate call clears it).
        self.seq = 0
        self.pending = False
        self.loading = False
        self._changed = asyncio.Event()
        conn.listen(self._event)

    def _event(self, method: str, params: dict[str, Any], session: str | None) -> None:
        if session != self.session:
            return
        if self.frame_id is not None and params.get("frameId") != self.frame_id:
            return
        if method in ("Page.frameRequestedNavigation", "Page.frameStartedNavigating"):
            self.seq += 1
            self.pending = True
        elif method == "Page.frameStartedLoading":
            self.seq += 1
            self.pending, self.loading = False, True
        elif method in ("Page.frameStoppedLoading", "Page.navigatedWithinDocument"):
            self.pending = self.loading = False
        else:
            return
        self._changed.set()

    @property
    def alive(self) -> bool:
        return not self.conn.closed.is_set()

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            return await self.conn.send(
                method, params, session=self.session, timeout=ACTION_TIMEOUT_S
            )
        except CdpError as exc:
            raise ToolFailure(f"the browser did not do {method}: {exc}") from exc

    async def evaluate(self, expression: str) -> Any:
        reply = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise ToolFailure(f"script error in the page: {str(text)[:300]}")
        return reply.get("result", {}).get("value")

    def mark(self) -> int:
        return self.seq

    def navigation_failed(self) -> None:
        self.pending = self.loading = False

    async def settle(self, before: int) -> None:
        """After an action: if it asked for a navigation, wait (bounded) until it loaded."""
        await self.evaluate("1")  # a round trip through the page: its handlers have run
        if self.seq == before:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SETTLE_TIMEOUT_S):
                while self.pending or self.loading:
                    self._changed.clear()
                    await self._changed.wait()
        if not self.alive:
            raise ToolFailure("the browser is gone (its process ended)")

    async def snapshot(self) -> str:
        raw = await self.evaluate(_PAGE_JS)
        try:
            page = json.loads(raw)
        except (TypeError, ValueError) as exc:
            raise ToolFailure("the page could not be read") from exc
        if not isinstance(page, dict):
            raise ToolFailure("the page could not be read")
        return f"URL: {page.get('url')}\nTitle: {page.get('title')}\n\n{page.get('text')}"

    async def close(self) -> None:
        with contextlib.suppress(CdpError):
            await self.conn.send("Browser.close", timeout=10.0)
        await self.conn.close()


async def open_browser(sandbox: Sandbox) -> BrowserSession:
    """Start Chromium inside `sandbox` and attach to a fresh page in a context of its own."""
    from clotho.gateway.channel import socket_place

    try:
        place = socket_place(sandbox)
    except ConfigError as exc:
        raise ToolFailure(
            f"the browser cannot run in a {type(sandbox).__name__} yet: it runs on the local "
            "backend or on Docker with a local daemon"
        ) from exc
    listener = _Listener(place.host_dir, place.owner_uid, place.mode)
    try:
        await listener.start()
        inner = f"{place.inner_dir}/{listener.name}"
        result = await sandbox.exec(launch_command(inner), timeout=START_TIMEOUT_S)
        if result.exit_code == NO_PYTHON_EXIT:
            raise ToolFailure(
                "the browser needs python3 in the sandbox (it starts Chromium there); "
                "this task's image has none"
            )
        if result.exit_code == NO_CHROMIUM_EXIT:
            raise ToolFailure(
                "Chromium is not installed in this sandbox: the browser runs inside the "
                "sandbox, so the task's image needs chromium (Debian: apt-get install chromium)"
            )
        line = result.stdout.strip()
        if not result.ok or not line.startswith("ok "):
            said = (line or result.stderr.strip())[-500:]
            raise ToolFailure(f"the browser did not start in the sandbox: {said!r}")
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                reader, writer = await listener.accepted
        except TimeoutError as exc:
            raise ToolFailure("the browser's launcher never connected") from exc
    except BaseException:
        if listener.accepted.done() and not listener.accepted.cancelled():
            listener.accepted.result()[1].close()  # the launcher ends Chromium on its EOF
        raise
    finally:
        listener.close()
    conn = CdpConnection(reader, writer)
    try:
        context = (await conn.send("Target.createBrowserContext", timeout=START_TIMEOUT_S))[
            "browserContextId"
        ]
        target = await conn.send(
            "Target.createTarget",
            {"url": "about:blank", "browserContextId": context},
            timeout=START_TIMEOUT_S,
        )
        attached = await conn.send(
            "Target.attachToTarget",
            {"targetId": target["targetId"], "flatten": True},
            timeout=START_TIMEOUT_S,
        )
        session = BrowserSession(conn, attached["sessionId"], context)
        await session.send("Page.enable")
        tree = await session.send("Page.getFrameTree")
        session.frame_id = tree["frameTree"]["frame"]["id"]
        await session.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False},
        )
    except (CdpError, KeyError, TypeError) as exc:
        await conn.close()
        raise ToolFailure(
            f"the browser started but did not answer as Chromium does: {exc}"
        ) from exc
    except BaseException:
        await conn.close()
        raise
    return session


# One browser per sandbox (a sandbox is one rollout's and never reused); the entry goes with it.
_sessions: weakref.WeakKeyDictionary[Sandbox, BrowserSession] = weakref.WeakKeyDictionary()
_starting: weakref.WeakKeyDictionary[Sandbox, asyncio.Lock] = weakref.WeakKeyDictionary()


async def browser_for(sandbox: Sandbox) -> BrowserSession:
    """The sandbox's browser, started on first use (again if the agent ended it)."""
    lock = _starting.setdefault(sandbox, asyncio.Lock())
    async with lock:
        session = _sessions.get(sandbox)
        if session is not None and session.alive:
            # The agent may have ended Chromium (it is a process of the sandbox): a dead one
            # never answers, and its pipe's end follows, so this settles either way.
            try:
                await session.conn.send("Browser.getVersion", timeout=ACTION_TIMEOUT_S)
            except CdpError:
                await session.conn.close()
        if session is None or not session.alive:
            session = await open_browser(sandbox)
            _sessions[sandbox] = session
        return session


async def close_browser(sandbox: Sandbox) -> None:
    """End the sandbox's browser now (closing the sandbox does it too)."""
    session = _sessions.pop(sandbox, None)
    if session is not None:
        await session.close()


async def _element(page: BrowserSession, ref: int) -> None:
    ok = await page.evaluate(
        f"(() => {{ const el = (window.__clothoRefs || [])[{int(ref) - 1}]; "
        "return !!(el && el.isConnected); })()"
    )
    if not ok:
        raise ToolFailure(
            f"no element [{ref}] on the page now; take a new browser_snapshot and use its numbers"
        )


def _page_text(rt: ToolRuntime, text: str) -> str:
    return truncate_middle(text, rt.max_output_chars)


@tool(parallel=False)
async def browser_navigate(rt: ToolRuntime, url: str) -> str:
    """Open a URL in the browser and return the page as text, its interactive elements numbered.

    The browser runs inside the task's sandbox: it reaches the sandbox's files
    (file:///path) and what the sandbox's network reaches (servers you start there answer
    on http://127.0.0.1:PORT).

    Args:
        url: the address to open, e.g. file:///app/index.html or http://127.0.0.1:8000/.
    """
    page = await browser_for(rt.sandbox)
    before = page.mark()
    try:
        reply = await page.conn.send(
            "Page.navigate", {"url": url}, session=page.session, timeout=ACTION_TIMEOUT_S
        )
    except CdpError as exc:
        if not page.alive:
            raise ToolFailure(f"the browser is gone ({exc})") from exc
        with contextlib.suppress(ToolFailure):
            await page.send("Page.stopLoading")
        page.navigation_failed()
        raise ToolFailure(
            f"could not open {url}: no answer within {ACTION_TIMEOUT_S:g} s (the sandbox's "
            "network may not reach it)"
        ) from exc
    if reply.get("errorText"):
        page.navigation_failed()
        raise ToolFailure(f"could not open {url}: {reply['errorText']}")
    await page.settle(before)
    return _page_text(rt, await page.snapshot())


@tool(parallel=False)
async def browser_snapshot(rt: ToolRuntime) -> str:
    """The current page as text: its visible text, each element you can act on numbered [N]."""
    page = await browser_for(rt.sandbox)
    return _page_text(rt, await page.snapshot())


@tool(parallel=False)
async def browser_click(rt: ToolRuntime, ref: int) -> str:
    """Click the element numbered [ref] in the latest snapshot; returns the page afterwards.

    Args:
        ref: the element's number from the latest snapshot.
    """
    page = await browser_for(rt.sandbox)
    await _element(page, ref)
    point = await page.evaluate(
        f"(() => {{ const el = window.__clothoRefs[{int(ref) - 1}]; "
        "el.scrollIntoView({block: 'center', inline: 'center'}); "
        "const r = el.getBoundingClientRect(); "
        "return r.width > 0 && r.height > 0 ? [r.left + r.width / 2, r.top + r.height / 2] "
        ": null; })()"
    )
    before = page.mark()
    if point is None:  # not laid out (e.g. an option): click it the DOM's way
        await page.evaluate(f"window.__clothoRefs[{int(ref) - 1}].click()")
    else:
        x, y = float(point[0]), float(point[1])
        await page.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for kind in ("mousePressed", "mouseReleased"):
            await page.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )
    await page.settle(before)
    return _page_text(rt, await page.snapshot())


@tool(parallel=False)
async def browser_type(rt: ToolRuntime, ref: int, text: str, submit: bool = False) -> str:
    """Type text into the field numbered [ref], replacing what it held; returns the page.

    Args:
        ref: the field's number from the latest snapshot.
        text: the text to type.
        submit: press Enter afterwards (submits the field's form).
    """
    page = await browser_for(rt.sandbox)
    await _element(page, ref)
    await page.evaluate(
        f"(() => {{ const el = window.__clothoRefs[{int(ref) - 1}]; el.focus(); "
        "if (typeof el.select === 'function') el.select(); "
        "else document.execCommand('selectAll'); })()"
    )
    before = page.mark()
    if text:
        await page.send("Input.insertText", {"text": text})
    else:
        await page.send(
            "Input.dispatchKeyEvent",
            {"type": "keyDown", "key": "Delete", "code": "Delete", "windowsVirtualKeyCode": 46},
        )
        await page.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": "Delete"})
    if submit:
        enter = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
        await page.send("Input.dispatchKeyEvent", {"type": "keyDown", "text": "\r", **enter})
        await page.send("Input.dispatchKeyEvent", {"type": "keyUp", **enter})
    await page.settle(before)
    return _page_text(rt, await page.snapshot())


@tool(parallel=False)
async def browser_select(rt: ToolRuntime, ref: int, option: str) -> str:
    """Choose an option of the drop-down numbered [ref], by its text or value; returns the page.

    Args:
        ref: the drop-down's number from the latest snapshot.
        option: the option's visible text (or its value).
    """
    page = await browser_for(rt.sandbox)
    await _element(page, ref)
    before = page.mark()
    found = await page.evaluate(
        f"(() => {{ const el = window.__clothoRefs[{int(ref) - 1}]; const want = "
        f"{json.dumps(option)}; if (el.tagName !== 'SELECT') return 'not a drop-down'; "
        "const opt = Array.from(el.options).find((o) => o.text.trim() === want.trim() "
        "|| o.value === want); if (!opt) return 'no option ' + JSON.stringify(want); "
        "el.value = opt.value; el.dispatchEvent(new Event('input', {bubbles: true})); "
        "el.dispatchEvent(new Event('change', {bubbles: true})); return ''; })()"
    )
    if found:
        raise ToolFailure(f"element [{ref}]: {found}")
    await page.settle(before)
    return _page_text(rt, await page.snapshot())


@tool(parallel=False)
async def browser_back(rt: ToolRuntime) -> str:
    """Go back one page in the browser's history; returns the page."""
    page = await browser_for(rt.sandbox)
    history = await page.send("Page.getNavigationHistory")
    index = int(history.get("currentIndex", 0))
    entries = history.get("entries") or []
    if index <= 0 or index > len(entries) - 1:
        raise ToolFailure("there is no earlier page in this browser's history")
    before = page.mark()
    await page.send("Page.navigateToHistoryEntry", {"entryId": entries[index - 1]["id"]})
    await page.settle(before)
    return _page_text(rt, await page.snapshot())


@tool(parallel=False)
async def browser_screenshot(rt: ToolRuntime, path: str = "screenshot.png") -> str:
    """Save a PNG screenshot of the visible page to a file in the sandbox.

    Look at it with `analyze_image` (vision toolset) where that is enabled.

    Args:
        path: where to write the PNG (relative paths start at the working directory).
    """
    page = await browser_for(rt.sandbox)
    shot = await page.send("Page.captureScreenshot", {"format": "png"})
    try:
        data = base64.b64decode(shot["data"], validate=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise ToolFailure("the browser returned no image") from exc
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ToolFailure("the browser's screenshot is not a PNG")
    try:
        await rt.sandbox.write_file(path, data)
    except IsADirectoryError as exc:
        raise ToolFailure(f"{path} is a directory") from exc
    return f"saved a {VIEWPORT[0]}x{VIEWPORT[1]} PNG screenshot ({len(data)} bytes) to " + (
        rt.sandbox.resolve(path)
    )


BROWSER_TOOLS = [
    browser_navigate,
    browser_snapshot,
    browser_click,
    browser_type,
    browser_select,
    browser_back,
    browser_screenshot,
]
