"""A job's curves, checkpoints and live events; cancel and delete."""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from core import artifacts, jobs
from core.db.session import session_scope
from core.db.tables import Checkpoint, Event, Metric
from core.settings import Settings
from tests.helpers import claim, finish, new_job

JOBS = "/api/v1/jobs"


def _write(url: str, job_id: uuid.UUID, token: int, points: list[jobs.Point]) -> None:
    """Write points as a worker does, in batches."""
    for start in range(0, len(points), 2000):
        with session_scope(url) as session:
            batch = points[start : start + 2000]
            jobs.write_metrics(session=session, job_id=job_id, token=token, points=batch)


@pytest.fixture(scope="module")
def curves(settings: Settings) -> tuple[uuid.UUID, dict[str, dict[int, float]]]:
    """A running job with 10,000 loss points (random values) and 40 lr points."""
    url = settings.database_url
    job_id = new_job(url)
    token = claim(url, job_id)
    rng = random.Random(0)
    loss = {step: rng.uniform(0, 3) for step in range(1, 10_001)}
    lr = {step: 0.1 / (1 + step // 2500) for step in range(250, 10_001, 250)}
    points = [jobs.Point("train/loss", s, v) for s, v in loss.items()]
    _write(url, job_id, token, points + [jobs.Point("lr", s, v) for s, v in lr.items()])
    return job_id, {"train/loss": loss, "lr": lr}


def test_curves_are_bucket_means_within_max_points(
    client: TestClient, curves: tuple[uuid.UUID, dict[str, dict[int, float]]]
) -> None:
    job_id, written = curves
    response = client.get(f"{JOBS}/{job_id}/metrics", params={"max_points": 100})
    assert response.status_code == 200
    series = response.json()["series"]
    assert set(series) == {"train/loss", "lr"}
    steps, values = series["train/loss"]["steps"], series["train/loss"]["values"]
    assert 90 <= len(steps) <= 100
    assert steps[0] <= 101
    assert steps[-1] == 10_000
    previous = 0
    for step, value in zip(steps, values, strict=True):
        bucket = [v for s, v in written["train/loss"].items() if previous < s <= step]
        assert value == pytest.approx(sum(bucket) / len(bucket))
        previous = step
    assert series["lr"]["steps"] == sorted(written["lr"])  # sparse: one point per bucket


def test_named_curves_with_room_for_every_point_are_exact(
    client: TestClient, curves: tuple[uuid.UUID, dict[str, dict[int, float]]]
) -> None:
    job_id, written = curves
    params = {"names": "lr", "max_points": 20_000}
    series = client.get(f"{JOBS}/{job_id}/metrics", params=params).json()["series"]
    assert list(series) == ["lr"]
    assert dict(zip(series["lr"]["steps"], series["lr"]["values"], strict=True)) == written["lr"]


def test_curves_show_points_written_after_an_earlier_read(
    client: TestClient, settings: Settings
) -> None:
    url = settings.database_url
    job_id = new_job(url)
    token = claim(url, job_id)
    read = f"{JOBS}/{job_id}/metrics"
    _write(url, job_id, token, [jobs.Point("lr", 1, 0.1)])
    assert client.get(read).json()["series"]["lr"]["steps"] == [1]
    _write(url, job_id, token, [jobs.Point("lr", 2, 0.01)])
    assert client.get(read).json()["series"]["lr"] == {"steps": [1, 2], "values": [0.1, 0.01]}


def test_curves_of_a_missing_job_are_404(client: TestClient) -> None:
    response = client.get(f"{JOBS}/{uuid.uuid4()}/metrics")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def _sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Parse an event stream into {"event", "data", "id"} dicts."""
    event: dict[str, Any] = {}
    for line in lines:
        if not line:
            if "event" in event:
                yield event
            event = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(": ")
            event[field] = json.loads(value) if field == "data" else value


Seen = dict[str, threading.Event]


def _run_worker(url: str, job_id: uuid.UUID, seen: Seen) -> None:
    """Act as a worker, each step once the stream showed the one before."""
    assert seen["queued"].wait(10), "the stream never showed the job queued"
    token = claim(url, job_id)
    with session_scope(url) as session:
        jobs.add_event(session=session, job_id=job_id, level="info", message="epoch 1", token=token)
        points = [jobs.Point("train/loss", 1, 2.0), jobs.Point("train/loss", 2, 1.5)]
        jobs.write_metrics(session=session, job_id=job_id, token=token, points=points)
        jobs.heartbeat(
            session=session, job_id=job_id, token=token, lease_seconds=60, step=2, total_steps=4
        )
    # The test metrics of step 2 arrive in a later write, after step 2 was streamed.
    assert seen["metrics"].wait(10), "the stream never sent the first points"
    with session_scope(url) as session:
        points = [jobs.Point("test/error", 2, 0.25)]
        jobs.write_metrics(session=session, job_id=job_id, token=token, points=points)
    assert seen["running"].wait(10), "the stream never showed the job running"
    finish(url, job_id, token, best_test_error=0.25)


def _follow(client: TestClient, url: str, seen: Seen) -> list[dict[str, Any]]:
    """Every event of a stream, until it ends; flags the statuses `seen` on the way."""
    events = []
    with client.stream("GET", url) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for event in _sse(response.iter_lines()):
            events.append(event)
            if event["event"] == "status":
                seen[event["data"]["status"]].set()
            seen.get(event["event"], threading.Event()).set()
    return events


def test_events_stream_live_until_the_job_ends(client: TestClient, settings: Settings) -> None:
    job_id = new_job(settings.database_url)
    seen = {name: threading.Event() for name in ("queued", "running", "succeeded", "metrics")}
    with ThreadPoolExecutor(2) as pool:
        reading = pool.submit(_follow, client, f"{JOBS}/{job_id}/events", seen)
        working = pool.submit(_run_worker, settings.database_url, job_id, seen)
        working.result(timeout=30)
        events = reading.result(timeout=30)
    kinds = [event["event"] for event in events]
    assert kinds[-1] == "end"
    assert events[-1]["data"] == {"status": "succeeded", "error": None}
    logs = [event["data"]["message"] for event in events if event["event"] == "log"]
    assert logs == ["queued", "attempt 1 on test (cpu)", "epoch 1", "succeeded"]
    statuses = [event["data"]["status"] for event in events if event["event"] == "status"]
    assert statuses == ["queued", "running", "succeeded"]
    progress = [event["data"]["step"] for event in events if event["event"] == "progress"]
    assert progress[-1] == 2
    points = [
        (name, step)
        for event in events
        if event["event"] == "metrics"
        for name, series in event["data"]["series"].items()
        for step in series["steps"]
    ]
    assert sorted(points) == [("test/error", 2), ("train/loss", 1), ("train/loss", 2)]


def test_events_resume_after_last_event_id(client: TestClient, settings: Settings) -> None:
    url = settings.database_url
    job_id = new_job(url)
    token = claim(url, job_id)
    with session_scope(url) as session:
        points = [jobs.Point("lr", step, 0.1) for step in (0, 5)]
        jobs.write_metrics(session=session, job_id=job_id, token=token, points=points)
    finish(url, job_id, token)
    with session_scope(url) as session:
        ids = session.scalars(select(Event.id).where(Event.job_id == job_id).order_by(Event.id))
        second = list(ids)[1]
    headers = {"Last-Event-ID": str(second)}
    with client.stream(
        "GET", f"{JOBS}/{job_id}/events", params={"since_step": 1}, headers=headers
    ) as response:
        events = list(_sse(response.iter_lines()))
    assert [(e["event"], e.get("id")) for e in events if e["event"] == "log"] == [
        ("log", str(second + 1))
    ]
    metrics = [e["data"]["series"] for e in events if e["event"] == "metrics"]
    assert metrics == [{"lr": {"steps": [5], "values": [0.1]}}]
    assert events[-1]["event"] == "end"


def test_cancel_queued_then_again(admin: TestClient, settings: Settings) -> None:
    job_id = new_job(settings.database_url)
    cancelled = admin.post(f"{JOBS}/{job_id}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    again = admin.post(f"{JOBS}/{job_id}/cancel")
    assert again.status_code == 409
    assert "already cancelled" in again.json()["error"]["message"]
    assert admin.post(f"{JOBS}/{uuid.uuid4()}/cancel").status_code == 404


def test_a_running_job_is_asked_to_cancel_and_cannot_be_deleted(
    admin: TestClient, settings: Settings
) -> None:
    job_id = new_job(settings.database_url)
    claim(settings.database_url, job_id)
    asked = admin.post(f"{JOBS}/{job_id}/cancel").json()
    assert (asked["status"], asked["cancel_requested"]) == ("running", True)
    refused = admin.delete(f"{JOBS}/{job_id}")
    assert refused.status_code == 409
    assert "cancel it first" in refused.json()["error"]["message"]
    assert admin.get(f"{JOBS}/{job_id}").status_code == 200


def _row_counts(url: str, job_id: uuid.UUID) -> list[int]:
    with session_scope(url) as session:
        return [
            session.scalar(select(func.count()).select_from(table).where(table.job_id == job_id))
            or 0
            for table in (Metric, Event, Checkpoint)
        ]


def test_checkpoints_are_listed_and_delete_removes_rows_and_files(
    admin: TestClient, settings: Settings
) -> None:
    url = settings.database_url
    job_id = new_job(url)
    token = claim(url, job_id)
    folder = artifacts.job_dir(settings, job_id)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "step-4.pt").write_bytes(b"weights")
    with session_scope(url) as session:
        path = str(folder / "checkpoints" / "step-4.pt")
        jobs.record_checkpoint(
            session=session, job_id=job_id, token=token, step=4, epoch=1, path=path,
            sha256="0" * 64, size=7, is_best=True, kept=[path],
        )  # fmt: skip
        jobs.write_metrics(
            session=session, job_id=job_id, token=token, points=[jobs.Point("lr", 4, 0.1)]
        )
    finish(url, job_id, token)
    listed = admin.get(f"{JOBS}/{job_id}/checkpoints").json()
    assert [(c["step"], c["is_best"], c["bytes"]) for c in listed] == [(4, True, 7)]
    assert all(count > 0 for count in _row_counts(url, job_id))
    assert admin.delete(f"{JOBS}/{job_id}").status_code == 204
    assert admin.get(f"{JOBS}/{job_id}").status_code == 404
    assert _row_counts(url, job_id) == [0, 0, 0]
    assert not folder.exists()
    assert admin.delete(f"{JOBS}/{job_id}").status_code == 404


def test_long_curves_are_sampled_at_written_points(client: TestClient, settings: Settings) -> None:
    url = settings.database_url
    job_id = new_job(url)
    token = claim(url, job_id)
    # 400 points spread over 400,000 steps: past the span where bucket means pay off.
    written = {step: float(step % 7) for step in range(1000, 400_001, 1000)}
    _write(url, job_id, token, [jobs.Point("train/loss", s, v) for s, v in written.items()])
    params = {"names": "train/loss", "max_points": 50}
    series = client.get(f"{JOBS}/{job_id}/metrics", params=params).json()["series"]["train/loss"]
    assert 40 <= len(series["steps"]) <= 50
    assert series["steps"] == sorted(series["steps"])
    assert series["steps"][0] == 1000
    # Samples are points that were written (Postgres), not bucket means.
    assert all(written[s] == v for s, v in zip(series["steps"], series["values"], strict=True))
