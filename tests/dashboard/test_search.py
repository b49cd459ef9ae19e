"""The runs page's `path op value` filter and a run's editable note, in headless Chromium."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.dashboard.helpers import Server, visit

pytestmark = pytest.mark.slow


def _submit(server: Server, name: str, lr: float) -> str:
    spec = {
        "kind": "train",
        "name": name,
        "model": {"name": "resnet8"},
        "dataset": {"name": "digits"},
        "recipe": {"epochs": 1, "lr": lr},
    }
    with server.client() as client:
        response = client.post("/api/v1/jobs", json=spec)
    assert response.status_code == 202, response.text
    job_id: str = response.json()["id"]
    return job_id


def test_a_filter_narrows_the_runs_and_a_note_persists(page: Page, server: Server) -> None:
    ids = {name: _submit(server, name, lr) for name, lr in [("low", 0.01), ("high", 0.3)]}
    visit(page, server, "#/runs")
    rows = page.locator("#runs tbody tr")
    expect(rows).to_have_count(2)
    page.fill("#filters input[name=filter]", "recipe.lr>0.2, dataset.name=digits")
    page.press("#filters input[name=filter]", "Enter")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-id", ids["high"])
    page.fill("#filters input[name=filter]", "recipe.lr<<1")
    page.press("#filters input[name=filter]", "Enter")
    expect(page.locator("#runs caption.error")).to_contain_text("starts with an operator")

    visit(page, server, f"#/runs/{ids['low']}")
    page.fill("#note textarea[name=note]", "lr too low: compare with high")
    page.fill("#note input[name=tags]", "keep, fig6")
    page.click("#save-note")
    expect(page.locator("#note .notice")).to_have_text("Saved.")
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    expect(page.locator("#note textarea[name=note]")).to_have_value("lr too low: compare with high")
    expect(page.locator("#note input[name=tags]")).to_have_value("keep, fig6")
