"""GET /workers: the register, with each worker alive or lost; read scope."""

from __future__ import annotations

import uuid
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select, update

from core import workers
from core.db.session import session_scope
from core.db.tables import Event, Worker, utcnow
from core.settings import Settings

WORKERS = "/api/v1/workers"


def test_workers_are_listed_alive_or_lost_to_a_reader(
    client: TestClient, anonymous: TestClient, settings: Settings
) -> None:
    url = settings.database_url
    with session_scope(url) as session:
        workers.register(session=session, name="gpu@a", host="a", pid=7, devices=["cuda:0"],
                         queues=["cpu", "gpu"])  # fmt: skip
        workers.register(session=session, name="cpu@b", host="b", pid=8, devices=["cpu"],
                         queues=["cpu"])  # fmt: skip
        lost = utcnow() - timedelta(
            seconds=workers.WORKER_LOST_AFTER_LEASES * settings.lease_seconds + 1
        )
        session.execute(update(Worker).where(Worker.name == "cpu@b").values(last_seen_at=lost))
    assert anonymous.get(WORKERS).status_code == 401
    response = client.get(WORKERS)
    assert response.status_code == 200, response.text
    listed = {worker["name"]: worker for worker in response.json()}
    assert {name: worker["state"] for name, worker in listed.items()} == {
        "cpu@b": "lost",
        "gpu@a": "alive",
    }
    gpu = listed["gpu@a"]
    assert (gpu["devices"], gpu["queues"], gpu["pid"], gpu["host"]) == (
        ["cuda:0"],
        ["cpu", "gpu"],
        7,
        "a",
    )
    assert (gpu["current_job"], gpu["jobs_done"]) == (None, 0)
    with session_scope(url) as session:
        for name in listed:
            workers.deregister(session=session, name=name)
    assert client.get(WORKERS).json() == []


def test_a_gpu_job_says_what_it_waits_for(client: TestClient, settings: Settings) -> None:
    body = {"kind": "train", "model": {"name": "resnet8"}, "dataset": {"name": "digits"}}
    small = client.post("/api/v1/jobs", json={**body, "recipe": {"epochs": 1}}).json()
    assert (small["queue"], small["waiting_for"]) == ("cpu", "any worker")
    assert small["spec"]["resources"] == {"device": "any", "gpus": 0}
    asked = {**body, "resources": {"gpus": 2}}
    job = client.post("/api/v1/jobs", json=asked).json()
    assert (job["queue"], job["waiting_for"]) == ("gpu-2", "a worker owning 2 GPUs")
    assert job["spec"]["resources"] == {"device": "gpu", "gpus": 2}
    with session_scope(settings.database_url) as session:
        query = select(Event.message).where(Event.job_id == uuid.UUID(job["id"]))
        log = list(session.scalars(query.order_by(Event.id)))
    assert log[1].startswith("waiting for a worker owning 2 GPUs (queue gpu-2): no live worker")
