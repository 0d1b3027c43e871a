"""Headless Chromium for the controller's page: the browser and its driver, and a bounded
wait on what the page shows.

Debian's ``chromium`` and ``chromium-driver`` driven by selenium. Without them a test is
skipped, unless ``REQUIRE_CHROMIUM`` is set (``.ci/run`` sets it): then it fails.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.integration.cluster import Cluster

T = TypeVar("T")

#: Generous: the machine running the tests may be loaded. The page polls every 2 s and
#: normally shows a change within a few seconds.
WAIT = 60.0


def chromium() -> tuple[str, str]:
    """The browser and its driver, or skip (fail with REQUIRE_CHROMIUM) naming what is absent."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", browser), ("chromedriver", driver))
               if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install -e '.[dev]')")
    if missing:
        why = f"no {', '.join(missing)}: apt-get install chromium chromium-driver"
        if os.environ.get("REQUIRE_CHROMIUM"):
            pytest.fail(f"REQUIRE_CHROMIUM is set but there is {why}")
        pytest.skip(why)
    assert browser is not None
    assert driver is not None
    return browser, driver


@contextmanager
def headless_chromium(profile: Path, size: tuple[int, int] = (1600, 1000)) -> Iterator[Any]:
    """A headless Chromium (a selenium driver) with its profile and driver log in ``profile``."""
    binary, driver = chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={size[0]},{size[1]}", f"--user-data-dir={profile / 'chromium'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(driver, log_output=str(profile / "chromedriver.log"))
    chrome = webdriver.Chrome(service=service, options=options)
    chrome.set_page_load_timeout(60)
    try:
        yield chrome
    finally:
        chrome.quit()


def wait_page(chrome: Any, c: Cluster, probe: Callable[[], T | None], what: str,
              timeout: float = WAIT) -> T:
    """Poll the page (through ``probe``) until it answers something truthy, or fail."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            status = chrome.execute_script(
                "const s = document.getElementById('status'); "
                "return s ? s.dataset.state + ': ' + s.textContent : null")
            raise AssertionError(f"waited {timeout:g}s for {what}; last: {last!r}; page status: "
                                 f"{status}\n{c.logs()}")
        time.sleep(0.2)


def console_errors(chrome: Any) -> list[dict[str, Any]]:
    """What the page logged as SEVERE, less the network's own (a refused API call)."""
    return [e for e in chrome.get_log("browser")
            if e["level"] == "SEVERE" and e.get("source") != "network"]
