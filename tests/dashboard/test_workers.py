"""The workers page in headless Chromium against the real API and Postgres: each registered
worker's state, devices, queues and current job, redrawn as heartbeats come and go."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import update

from core import workers
from core.db.session import session_scope
from core.db.tables import Worker, utcnow
from tests.dashboard.helpers import Server, screenshot, visit
from tests.helpers import new_job

pytestmark = pytest.mark.slow


@pytest.fixture
def registered(server: Server) -> Iterator[str]:
    """A GPU worker running a job, and a CPU worker unseen for longer than three leases."""
    url = server.settings.database_url
    job_id = new_job(url, name="on the gpu")
    stale = utcnow() - timedelta(seconds=4 * server.settings.lease_seconds)
    with session_scope(url) as session:
        workers.register(session=session, name="worker-gpu0@a", host="a", pid=11,
                         devices=["cuda:0"], queues=["cpu", "gpu"])  # fmt: skip
        workers.running(session=session, name="worker-gpu0@a", job_id=job_id)
        workers.register(session=session, name="worker@b", host="b", pid=12, devices=["cpu"],
                         queues=["cpu"])  # fmt: skip
        session.execute(update(Worker).where(Worker.name == "worker@b").values(last_seen_at=stale))
    yield str(job_id)
    with session_scope(url) as session:
        for name in ("worker-gpu0@a", "worker@b"):
            workers.deregister(session=session, name=name)


def test_the_workers_page_shows_each_worker_and_follows_its_heartbeat(
    page: Page, server: Server, registered: str
) -> None:
    visit(page, server, "#/workers")
    gpu = page.locator("#workers tr[data-name='worker-gpu0@a']")
    cpu = page.locator("#workers tr[data-name='worker@b']")
    expect(gpu.locator(".status")).to_have_text("alive")
    expect(cpu.locator(".status")).to_have_text("lost")
    expect(gpu.locator("td.devices")).to_have_text("cuda:0")
    assert gpu.locator("td.queues .tag").all_inner_texts() == ["cpu", "gpu"]
    assert cpu.locator("td.queues .tag").all_inner_texts() == ["cpu"]
    expect(gpu.locator("td.job a")).to_have_attribute("href", f"#/runs/{registered}")
    expect(page.locator("header nav a.active")).to_have_text("Workers")
    screenshot(page, "workers")

    with session_scope(server.settings.database_url) as session:
        workers.heartbeat(session=session, name="worker@b")
        workers.finished(session=session, name="worker-gpu0@a")
    expect(cpu.locator(".status")).to_have_text("alive")  # the page polls: no reload
    expect(gpu.locator("td.job")).to_have_text("\u2013")
    expect(gpu.locator("td.done")).to_have_text("1")
    gpu.locator("td").first.hover()
    expect(gpu.locator("td").first).to_have_attribute("title", "pid 11 on a")


def test_a_queued_gpu_job_says_what_it_needs_and_waits_for(page: Page, server: Server) -> None:
    spec = {"kind": "train", "name": "needs a gpu", "model": {"name": "resnet8"}}
    spec |= {"dataset": {"name": "digits"}, "resources": {"gpus": 1}}
    with server.client() as client:
        response = client.post("/api/v1/jobs", json=spec)
    assert response.status_code == 202, response.text
    visit(page, server, f"#/runs/{response.json()['id']}")
    expect(page.locator("#waiting-for")).to_have_text("a worker with a GPU")
    expect(page.locator("#facts")).to_contain_text("gpu · 1 GPU · queue gpu")
    screenshot(page, "run-waiting-for-gpu")
