"""Headless Chromium (the system browser, driven by Playwright) for trace pages: checks and PNGs.

Playwright is an optional dependency (the ``test`` extra); its own browser download is not
needed: the system ``chromium`` is used.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentrl_sdk.tracing.server import trace_url

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_executable() -> str | None:
    """The system Chromium's path, or None when none is installed."""
    return next((path for name in _BROWSERS if (path := shutil.which(name))), None)


@contextmanager
def headless_page(width: int = 1440, height: int = 900) -> Iterator[Any]:
    """A Playwright page in headless system Chromium.

    Raises:
        RuntimeError: no Chromium installed (``apt-get install chromium``) or no Playwright.
    """
    executable = chromium_executable()
    if executable is None:
        raise RuntimeError("no Chromium found: install it (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise RuntimeError("Playwright is missing: pip install 'agentrl-sdk[test]'") from exc
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def open_trace(page: Any, base_url: str, experiment_id: str, trace_id: str, *,
               root_name: str, span_name: str | None = None, timeout_s: float = 60.0) -> str:
    """Open a trace in the MLflow UI, select ``span_name`` and its Attributes tab; the page text.

    Waits (up to ``timeout_s``) for the root span ``root_name`` to be drawn, and for the span's
    attributes to show. A click that lands while the UI is still drawing the span tree can be
    lost, so the span and its tab are clicked again until they do.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    timeout = timeout_s * 1000
    deadline = time.monotonic() + timeout_s
    page.goto(trace_url(base_url, experiment_id, trace_id))
    page.get_by_text(root_name, exact=True).first.wait_for(timeout=timeout)
    while span_name is not None:
        page.get_by_text(span_name, exact=True).first.click(timeout=timeout)
        page.get_by_text("Attributes", exact=True).first.click(timeout=timeout)
        try:
            page.get_by_text("agentrl.response_ids", exact=True).first.wait_for(
                state="attached", timeout=_ATTRIBUTES_WAIT_MS)
            break
        except PlaywrightTimeout:
            if time.monotonic() > deadline:
                raise
    return page.inner_text("body")


_ATTRIBUTES_WAIT_MS = 10_000
