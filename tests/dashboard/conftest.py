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
from tests.api.helpers import make_key
from tests.dashboard.helpers import CHROMIUM, CHROMIUM_ARGS, Server, open_page
from tests.services import serve


@pytest.fixture(scope="module")
def settings(
    postgres_url: str, redis_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    """Auth on, fast event-stream polls, artifacts where the tests' workers write them."""
    root = tmp_path_factory.mktemp("dashboard")
    return Settings(
        database_url=postgres_url,
        broker_url=redis_broker_url,
        artifact_dir=root / "artifacts",
        data_dir=root / "data",
        auth_enabled=True,
        stream_poll_seconds=0.1,
        lease_seconds=10,
        heartbeat_seconds=1.0,
        max_versions_per_job=50,  # the models page is paged with versions of one job
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
