"""The models page's "what was served" panel of a version: the drift of the images it
served and its payload segments, downloaded from the page."""

from __future__ import annotations

import gzip
import json
import uuid

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import update

from core import keys
from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests import images
from tests.dashboard.helpers import Server, screenshot, visit
from tests.helpers import trained_job, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """The dashboard's settings with every image logged, written a tenth of a second on."""
    return settings.model_copy(update={"payload_log_sample": 1.0, "payload_log_flush_seconds": 0.1})


def owned_job(server: Server) -> uuid.UUID:
    """A trained job (ResNet-8, 8x8 synthetic images) of the server's key."""
    job_id = trained_job(server.settings)
    url = server.settings.database_url
    with session_scope(url) as session:
        principal = keys.authenticate(session=session, key=server.key)
        assert principal is not None
        session.execute(update(Job).where(Job.id == job_id).values(owner_key_id=principal.key_id))
    return job_id


def test_a_versions_panel_shows_its_drift_and_downloads_its_payloads(
    page: Page, server: Server
) -> None:
    job_id = owned_job(server)
    pictures = [("files", (f"{n}.png", images.flat_png(n * 60), "image/png")) for n in range(4)]
    with server.client() as client:
        made = client.post("/api/v1/registry/served/versions", json={"job": str(job_id)})
        assert made.status_code == 201, made.text
        answer = client.post("/api/v1/predict", params={"model": "served/1"}, files=pictures)
        assert answer.status_code == 200, answer.text
        path = "/api/v1/registry/served/versions/1/payloads"
        wait_for(lambda: client.get(path).json()["items"], 30, "the payload segment")

    visit(page, server, "#/models")
    panel = page.locator("[data-model='served'] details[data-served-version='1']")
    panel.locator("summary").click()
    expect(panel.locator("[data-role=drift-window]")).to_contain_text("Drift over 4 images")
    expect(panel.locator("table[data-role=drift] tbody tr")).to_have_count(3)
    # Flat greys at 0, 60, 120 and 180 of 255: a mean of 90 / 255 in every channel.
    expect(panel.locator("tr[data-channel='0'] td").nth(1)).to_have_text(f"{90 / 255:.3f}")
    expect(panel.locator("[data-role=class-drift]")).to_contain_text("total variation")
    row = panel.locator("table[data-role=payloads] tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(2)).to_have_text("4")
    screenshot(page, "served")
    with page.expect_download(timeout=30_000) as download:
        row.locator("button[data-action=payloads]").click()
    assert download.value.suggested_filename.startswith("served-v1-")
    records = gzip.decompress(download.value.path().read_bytes()).decode().splitlines()
    assert [json.loads(line)["version"] for line in records] == [1, 1, 1, 1]
