"""Dashboard fixtures: the real API on a free port, headless Chromium, API keys, screenshots.

The browser is Debian's chromium driven by Playwright (its own browser download cannot
work here); a missing /usr/bin/chromium fails these tests rather than skipping them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, sync_playwright

from api.app import create_app
from core.settings import Settings
from tests.api.conftest import make_key
from tests.conftest import serve
from tests.worker import conftest as worker_fixtures

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
KEY_STORAGE = "resnet-service.key"  # the sessionStorage entry api.js keeps the key in
# A Redis database no other test run holds, claimed as the worker tests claim theirs.
redis_broker_url = worker_fixtures.redis_broker_url


@dataclass
class Server:
    """The API served by uvicorn in a thread of the test process."""

    settings: Settings
    url: str
    key: str  # read + train + predict

    def client(self, key: str | None = None) -> httpx.Client:
        """An HTTP client of the server with `key` (default: the read + train one)."""
        headers = {"Authorization": f"Bearer {key or self.key}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


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


def open_page(browser: Browser, server: Server, key: str | None, errors: list[str]) -> Page:
    """A new tab whose session already holds `key` (None: it will be asked for).

    Uncaught script errors, and any request that leaves the server (the dashboard must
    work offline), are appended to `errors`; such requests are refused.
    """
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    if key is not None:
        context.add_init_script(f"sessionStorage.setItem({KEY_STORAGE!r}, {key!r})")

    def offline(route: Route) -> None:
        if route.request.url.startswith((server.url, "blob:", "data:")):
            route.continue_()
        else:
            errors.append(f"request to {route.request.url}")
            route.abort()

    context.route("**/*", offline)
    tab = context.new_page()
    tab.set_default_timeout(20_000)
    tab.on("pageerror", lambda error: errors.append(str(error)))
    return tab


@pytest.fixture
def page(browser: Browser, server: Server) -> Iterator[Page]:
    """A tab with the read + train + predict key; the test fails on any uncaught script
    error or request that leaves the server."""
    errors: list[str] = []
    tab = open_page(browser, server, server.key, errors)
    yield tab
    tab.context.close()
    assert not errors, f"the page failed: {errors}"


def visit(page: Page, server: Server, hash_route: str) -> None:
    """Open the dashboard at `hash_route` (e.g. "#/runs") and wait until it has drawn."""
    page.goto(f"{server.url}/{hash_route}")
    page.wait_for_selector("body[data-ready='1']")


def screenshot(page: Page, name: str) -> Path:
    """Save the whole page as test-artifacts/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def chart_data(page: Page, selector: str) -> list[dict[str, Any]]:
    """The traces plotly drew into the div at `selector` (x, y, name, meta per trace)."""
    data: list[dict[str, Any]] = page.evaluate(
        """(selector) => (document.querySelector(selector)?.data ?? []).map((t) => ({
            name: t.name, x: Array.from(t.x ?? []), y: Array.from(t.y ?? []),
            meta: t.meta ?? null, width: t.line?.width ?? null, color: t.line?.color ?? null,
            z: t.z ?? null, type: t.type ?? "scatter" }))""",
        selector,
    )
    return data
