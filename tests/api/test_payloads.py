"""What was served, over HTTP: a registered version's (and a job's) payload segments listed,
paged and downloaded, its drift, both only for callers who may read the model, the
series on /metrics, and a clean stop that writes what was buffered."""

from __future__ import annotations

import gzip
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from api.app import create_app
from client.api import Client
from core import layout
from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from core.storage import store_for
from serving import payloads
from tests import images
from tests.helpers import Key, key_of, trained_job, wait_for

API = "/api/v1"
VERSION = f"{API}/registry/tiny/versions/1"
FILES = [("files", (f"{n}.png", images.flat_png(n * 40), "image/png")) for n in range(3)]


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """Every image logged, written a tenth of a second after it was served, three to a
    segment; reads kept to their owner."""
    return settings.model_copy(
        update={
            "payload_log_sample": 1.0,
            "payload_log_flush_seconds": 0.1,
            "payload_log_batch": 3,  # a request's three images make a segment
            "reads_owner_only": True,
        }
    )


@pytest.fixture(scope="module")
def owner(settings: Settings) -> Key:
    """The key that trains, registers and predicts with `tiny`."""
    return key_of(settings.database_url, "read", "train", "predict")


@pytest.fixture(scope="module")
def job(settings: Settings, owner: Key) -> uuid.UUID:
    """A succeeded train job (ResNet-8 on 8x8 synthetic images) of the owner's key."""
    job_id = trained_job(settings)
    with session_scope(settings.database_url) as session:
        session.execute(
            update(Job).where(Job.id == job_id).values(owner_key_id=uuid.UUID(owner.id))
        )
    return job_id


@pytest.fixture(scope="module")
def served(anonymous: TestClient, owner: Key, job: uuid.UUID) -> Iterator[TestClient]:
    """tiny/1 registered by the owner, and predicted twice (six images)."""
    with TestClient(anonymous.app, headers=owner.headers) as client:
        yield _predicted(client, job)


def _predicted(client: TestClient, job: uuid.UUID) -> TestClient:
    made = client.post(f"{API}/registry/tiny/versions", json={"job": str(job)})
    assert made.status_code == 201, made.text
    for _ in range(2):
        answer = client.post(f"{API}/predict", params={"model": "tiny/1"}, files=FILES)
        assert answer.status_code == 200, answer.text
    return client


def logged(client: TestClient, path: str, records: int) -> list[dict[str, Any]]:
    """The segments under `path` once they hold `records` records (the writer runs apart)."""

    def enough() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = client.get(path).json()["items"]
        return items if sum(item["records"] for item in items) >= records else None

    return wait_for(enough, 30, f"{records} payload records under {path}")


def test_a_versions_segments_are_listed_paged_and_downloaded(
    served: TestClient, owner: Key
) -> None:
    found = logged(served, f"{VERSION}/payloads", 6)
    assert [item["records"] for item in found] == [3, 3]
    assert [item["first_at"] for item in found] == sorted(
        (item["first_at"] for item in found), reverse=True
    )
    records = []
    for item in found:
        download = served.get(item["file"])
        assert download.status_code == 200
        assert download.headers["x-checksum-sha256"] == item["sha256"]
        assert hashlib.sha256(download.content).hexdigest() == item["sha256"]
        lines = gzip.decompress(download.content).decode().splitlines()
        assert len(lines) == item["records"]
        records += [json.loads(line) for line in lines]
    assert {(r["model"], r["version"], r["caller"]) for r in records} == {("tiny", 1, owner.id)}
    assert all(len(r["sha256"]) == 64 and r["top"] and "image_png" not in r for r in records)
    first = served.get(f"{VERSION}/payloads", params={"limit": 1}).json()
    assert first["items"] == found[:1]
    rest = served.get(f"{VERSION}/payloads", params={"cursor": first["next_cursor"]}).json()
    assert rest == {"items": found[1:], "next_cursor": None}


def test_refusals_name_what_to_do(served: TestClient) -> None:
    bad_cursor = served.get(f"{VERSION}/payloads", params={"cursor": "x"})
    assert bad_cursor.status_code == 422
    assert "next_cursor" in bad_cursor.json()["error"]["message"]
    gone = f"{'0' * 13}-{'0' * 13}-1-{'a' * 64}.jsonl.gz"
    missing = served.get(f"{VERSION}/payloads/{gone}")
    assert missing.status_code == 404
    assert "PAYLOAD_LOG_MAX_BYTES" in missing.json()["error"]["message"]
    assert served.get(f"{VERSION}/payloads/segment.txt").status_code == 422
    assert served.get(f"{API}/registry/tiny/versions/9/payloads").status_code == 404


def test_the_drift_of_what_was_served(served: TestClient) -> None:
    logged(served, f"{VERSION}/payloads", 6)
    drift = served.get(f"{VERSION}/drift").json()
    assert drift["window"]["images"] == 6
    # The tiny run's checkpoint records its training split's class counts.
    assert drift["reference"]["class_source"] == "training_split"
    assert sum(drift["reference"]["class_distribution"]) == pytest.approx(1.0)
    assert len(drift["reference"]["mean"]) == len(drift["channels"]) == 3
    # Flat grey images at 0, 40 and 80 of 255: their mean is 40 / 255 in every channel.
    for channel in drift["channels"]:
        assert channel["mean"] == pytest.approx(40 / 255)
        mean, std = (drift["reference"][k][channel["channel"]] for k in ("mean", "std"))
        assert channel["shift"] == pytest.approx(abs(40 / 255 - mean) / std)
    assert sum(drift["classes"]["counts"]) == 6
    metrics = served.get(f"{API}/metrics").text
    assert 'resnet_payload_log_records_total{model="tiny/1"}' in metrics
    assert 'resnet_model_drift_mean_shift{channel="0",model="tiny/1"}' in metrics


def test_only_readers_of_the_model_see_what_it_served(
    served: TestClient, settings: Settings, job: uuid.UUID
) -> None:
    found = logged(served, f"{VERSION}/payloads", 6)
    other = key_of(settings.database_url, "read")
    for path in (f"{VERSION}/payloads", found[0]["file"], f"{VERSION}/drift"):
        refused = served.get(path, headers=other.headers)
        assert refused.status_code == 404, path
        assert "not registered" in refused.json()["error"]["message"]
    assert served.get(f"{API}/jobs/{job}/payloads", headers=other.headers).status_code == 404


def test_a_job_served_by_its_id_has_its_own_log(served: TestClient, job: uuid.UUID) -> None:
    answer = served.post(f"{API}/predict", params={"model": str(job)}, files=FILES[:1])
    assert answer.status_code == 200, answer.text
    (segment,) = logged(served, f"{API}/jobs/{job}/payloads", 1)
    assert served.get(segment["file"]).status_code == 200
    assert served.get(f"{API}/jobs/{job}/drift").json()["window"]["images"] == 1


@pytest.fixture
def slow_app(settings: Settings) -> tuple[TestClient, Settings]:
    """An app whose writer would wait an hour: only its stop writes the buffer."""
    changed = settings.model_copy(
        update={
            "payload_log_flush_seconds": 3600,
            "payload_log_batch": 64,
            "reads_owner_only": False,
        }
    )
    return TestClient(create_app(changed)), changed


def test_a_clean_stop_writes_what_was_buffered(
    slow_app: tuple[TestClient, Settings], owner: Key, served: TestClient
) -> None:
    client, settings = slow_app
    prefix = layout.payload_prefix("tiny", 1)
    before = sum(s.records for s in payloads.segments(store_for(settings), prefix))
    with client:
        answer = client.post(
            f"{API}/predict", params={"model": "tiny/1"}, files=FILES, headers=owner.headers
        )
        assert answer.status_code == 200, answer.text
    after = sum(s.records for s in payloads.segments(store_for(settings), prefix))
    assert after - before == 3


def test_drift_turned_off_has_no_tap_and_its_route_says_how_to_turn_it_on(
    settings: Settings, owner: Key, served: TestClient
) -> None:
    off = settings.model_copy(update={"drift_enabled": False, "reads_owner_only": False})
    app = create_app(off)
    with TestClient(app, headers=owner.headers) as client:
        plane, monitor = client.app_state["plane"], client.app_state["drift"]
        assert monitor.tap not in plane.taps  # no per-batch cost
        answer = client.post(f"{API}/predict", params={"model": "tiny/1"}, files=FILES)
        assert answer.status_code == 200, answer.text
        refused = client.get(f"{VERSION}/drift")
        assert refused.status_code == 409
        assert "DRIFT_ENABLED=true" in refused.json()["error"]["message"]
        metrics = client.get(f"{API}/metrics").text
        assert "resnet_model_drift_window_images{" not in metrics
        assert client.get(f"{VERSION}/payloads").status_code == 200  # the log still runs


def test_the_python_client_reads_the_log_and_the_drift(
    served: TestClient, owner: Key, tmp_path: Path
) -> None:
    logged(served, f"{VERSION}/payloads", 6)
    key = owner.headers["Authorization"].removeprefix("Bearer ")
    # The app in this process, through the test client's transport (its lifespan's state).
    with Client("http://testserver", key, transport=served._transport) as client:
        segments = list(client.payloads("tiny/1", page_size=1))
        assert segments == served.get(f"{VERSION}/payloads").json()["items"]  # every page
        assert len(segments) >= 2
        saved = client.download_payloads("tiny/1", segments[0]["name"], to=tmp_path)
        assert saved.name == f"tiny-v1-{segments[0]['name']}"
        assert len(list(payloads.read_records(saved))) == 3
        assert client.drift("tiny/1")["window"]["images"] == 6
