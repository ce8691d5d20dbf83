"""Fixtures of the browser suite (issue 21 item 1): Debian's chromium driven by Playwright, real processes behind it.

The broker, PostgreSQL, a live projector, a ``settled worker`` child (`tests/browser/ui_app.py`) and a ``settled api``
child are real, as in `tests/integration/api`. The browser is Debian's ``/usr/bin/chromium`` (``.ci/run`` installs
packages ``chromium`` and ``chromium-driver`` when missing), launched headless through ``executable_path``: this suite
never runs ``playwright install``, which downloads a browser.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from settled import _failpoints
from settled._settings import Settings
from settled.testing import WorkerProcess
from tests.harness.workers import start_worker
from tests.integration.api.conftest import key_file, names, start_api, token, tokens, topics
from tests.integration.engine.engine_app import WORLD_ENV

__all__ = ["key_file", "names", "start_api", "token", "tokens", "topics"]  # fixtures shared with the API tests

ROOT = Path(__file__).resolve().parents[2]
UI_APP = "tests.browser.ui_app:app"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
ARTIFACTS = ROOT / ".ci" / "artifacts" / "ui"


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Debian's chromium, headless, for the whole session."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium and chromium-driver (.ci/run does)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context (its own cookies) and page."""
    context = browser.new_context()
    context.set_default_timeout(30_000)
    yield context.new_page()
    context.close()


@pytest.fixture
def world_path(tmp_path: Path) -> Path:
    """The engine tests' world database the worker's tools count their invocations in."""
    return tmp_path / "world.sqlite"


@pytest.fixture
def worker(topics: Settings, tmp_path: Path, world_path: Path) -> Iterator[WorkerProcess]:
    """A ``settled worker`` child running `tests/browser/ui_app.py` (killed at teardown if still running)."""
    proc = start_worker(
        topics,
        tmp_path / "worker.log",
        name="w1",
        app=UI_APP,
        control=_failpoints.FailpointControl(tmp_path / "fp"),
        env={WORLD_ENV: str(world_path)},
        append_log=False,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def screenshot(page: Page, name: str) -> Path:
    """Write a full-page screenshot to ``.ci/artifacts/ui/<name>.png`` and print its path.

    Args:
        page: The page.
        name: The file's stem.

    Returns:
        The file written.
    """
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path
