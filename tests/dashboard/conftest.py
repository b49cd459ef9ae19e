"""Dashboard fixtures: the real API on a free port, headless Chromium, a tab with a key.

The browser is Debian's chromium driven by Playwright (its own browser download cannot
work here); a missing /usr/bin/chromium fails these tests rather than skipping them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from api.app import create_app
from core.settings import Settings
from tests.dashboard.helpers import CHROMIUM, CHROMIUM_ARGS, Server, open_page
from tests.helpers import make_key
from tests.services import serve


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """The module's settings with event-stream polls of 0.1 s, leases a worker renews each
    second, and room for a paged list of one job's versions on the models page."""
    return settings.model_copy(
        update={
            "stream_poll_seconds": 0.1,
            "lease_seconds": 10,
            "heartbeat_seconds": 1.0,
            "max_versions_per_job": 50,
        }
    )


@pytest.fixture(scope="module")
def server(settings: Settings) -> Iterator[Server]:
    """The API on a free port of 127.0.0.1 until the module ends."""
    with serve(create_app(settings)) as url:
        yield Server(settings, url, make_key(settings.database_url, "read", "train", "predict"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Debian chromium (fails, with the fix, when it is not installed)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (make test does it)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, server: Server) -> Iterator[Page]:
    """A tab with the read + train + predict key; the test fails on any uncaught script
    error or request that leaves the server."""
    errors: list[str] = []
    tab = open_page(browser, server, server.key, errors)
    yield tab
    tab.context.close()
    assert not errors, f"the page failed: {errors}"
