"""Helpers of the dashboard tests: the served API, tabs of headless Chromium, screenshots
and the charts plotly drew."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Browser, Page, Route

from core.settings import Settings

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
