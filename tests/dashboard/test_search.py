"""The runs page's `path op value` filter, a run's editable note, and a run's record of its
data and environment, in headless Chromium."""

from __future__ import annotations

import uuid

import pytest
import torch
from playwright.sync_api import Page, expect

from core import jobs
from core.db.session import session_scope
from tests.dashboard.helpers import Server, visit
from tests.helpers import claim
from training.environment import environment

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


def test_a_run_shows_its_data_and_environment_and_its_digest_lists_its_runs(
    page: Page, server: Server
) -> None:
    url = server.settings.database_url
    digest = "sha256:" + "3f2a9c01" * 8
    ids = [_submit(server, name, 0.1) for name in ("same data", "same data too", "other data")]
    data = {
        "digest": digest,
        "source": "photos",
        "classes": ["cat", "dog"],
        "splits": {"train": 40, "val": 5, "test": 9},
        "skipped": [{"file": "cat/broken.jpg", "error": "cannot identify image file"}],
        "skipped_count": 1,
    }
    for job_id in ids[:2]:
        token = claim(url, uuid.UUID(job_id))
        with session_scope(url) as session:
            jobs.record_run(
                session=session,
                job_id=uuid.UUID(job_id),
                token=token,
                data=data,
                environment=environment(),
            )
    visit(page, server, f"#/runs/{ids[0]}")
    record = page.locator("#run-record")
    expect(record.locator("#data-digest")).to_have_text(digest)
    expect(record.locator("#data-splits")).to_have_text("train 40 · val 5 · test 9")
    expect(record.locator("#data-skipped")).to_contain_text("cat/broken.jpg")
    expect(record).to_contain_text("cat, dog")
    expect(record.locator("#environment")).to_contain_text(f"torch {torch.__version__}")
    record.locator("#data-digest").click()
    rows = page.locator("#runs tbody tr")
    expect(rows).to_have_count(2)
    assert {rows.nth(i).get_attribute("data-id") for i in range(2)} == set(ids[:2])
