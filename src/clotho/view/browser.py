"""Headless Chromium (Debian's `chromium` + `chromium-driver`) driven by Selenium, for the
viewer's browser test, its benchmark and the screenshots in docs/.

The flags keep Chromium off the network it would otherwise call home to (background
networking, component updates, sync, QUIC) and give each session a fresh profile.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from clotho.errors import ConfigError

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def find_chromium() -> tuple[str, str] | None:
    """(browser, driver) paths, or None when Debian's packages are not installed."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        return None
    return browser, driver


@contextmanager
def chromium(width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A Selenium WebDriver on a headless Chromium with a throw-away profile."""
    found = find_chromium()
    if found is None:
        raise ConfigError("no chromium: apt-get install -y chromium chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        raise ConfigError("the browser needs Selenium: pip install selenium") from exc
    browser, driver_path = found
    profile = tempfile.mkdtemp(prefix="clotho-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
