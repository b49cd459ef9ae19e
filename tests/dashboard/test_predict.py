"""A predict job's run page: its pinned model, its figures and files, its confusion matrix."""

from __future__ import annotations

import json
import uuid

import pytest
from playwright.sync_api import Page, expect

from tests.dashboard.helpers import Server, chart_data, screenshot, visit
from tests.helpers import run_job, trained_job
from training.events import RecordingSink

pytestmark = pytest.mark.slow

SYNTHETIC = {"name": "synthetic", "image_size": 8, "train_size": 32, "test_size": 24}


def test_a_predict_jobs_page_shows_its_files_and_confusion_matrix(
    page: Page, server: Server
) -> None:
    source = trained_job(server.settings)
    spec = {"kind": "predict", "model": str(source), "dataset": SYNTHETIC, "format": "both"}
    with server.client() as client:
        answer = client.post("/api/v1/jobs", json=spec)
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]
    run_job(server.settings, uuid.UUID(job_id), RecordingSink())

    visit(page, server, f"#/runs/{job_id}")

    facts = page.locator("#facts")
    expect(facts).to_contain_text("top-5 error")
    expect(facts).to_contain_text(f"{source} → job {source}, step 2")
    expect(page.locator("#artifacts")).to_contain_text("predictions.jsonl")
    with page.expect_download() as download:
        page.click("#artifacts a[data-artifact='confusion.json']")
    assert json.loads(download.value.path().read_text())["classes"]
    page.wait_for_function("document.querySelector('#chart-confusion')?.data?.length === 1")
    [heatmap] = chart_data(page, "#chart-confusion")
    assert sum(map(sum, heatmap["z"])) == 24
    screenshot(page, "predict")
