"""Submitting a fine-tune: its init.source is resolved and pinned, or refused with a 422."""

from __future__ import annotations

import uuid
from typing import Any

import redis
from fastapi.testclient import TestClient

from core import model_registry
from core.db.session import session_scope
from core.db.tables import Checkpoint
from core.settings import Settings
from tests.helpers import TRAIN, claim, finish, new_job, queued_ids

JOBS = "/api/v1/jobs"
SHA256 = "ab" * 32


def _fine_tune(source: str, model: str = "resnet20") -> dict[str, Any]:
    return {**TRAIN, "model": {"name": model}, "init": {"source": source, "freeze": ["stem"]}}


def _registered(settings: Settings, name: str) -> uuid.UUID:
    """A succeeded train job with a best checkpoint, registered as `name`/1."""
    url = settings.database_url
    job_id = new_job(url)
    finish(url, job_id, claim(url, job_id))
    with session_scope(url) as session:
        best = Checkpoint(job_id=job_id, step=40, epoch=1, path="/nowhere/best.pt", bytes=1)
        best.sha256, best.is_best = SHA256, True
        session.add(best)
        session.flush()
        model_registry.register(session=session, name=name, job_id=job_id)
    return job_id


def _refusal(response: Any) -> tuple[list[Any], str]:
    assert response.status_code == 422, response.text
    detail = response.json()["error"]["details"][0]
    return detail["loc"], detail["msg"]


def test_an_unknown_reference_is_422_naming_it(client: TestClient, queue: redis.Redis) -> None:
    loc, message = _refusal(client.post(JOBS, json=_fine_tune("no-such-model@production")))
    assert loc == ["body", "init", "source"]
    assert (
        message == "init.source 'no-such-model@production': model 'no-such-model' is not registered"
    )
    assert queued_ids(queue) == []


def test_another_net_than_the_sources_is_422(client: TestClient, settings: Settings) -> None:
    _registered(settings, "base-r20-net")
    loc, message = _refusal(client.post(JOBS, json=_fine_tune("base-r20-net/1", "resnet32")))
    assert loc == ["body", "model"]
    assert "model resnet32 is not the net of init.source 'base-r20-net/1' (resnet20)" in message


def test_a_fine_tune_pins_its_checkpoint_and_replays_under_its_idempotency_key(
    client: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    source = _registered(settings, "base-r20")
    headers = {"Idempotency-Key": f"tune-{uuid.uuid4()}"}
    first = client.post(JOBS, json=_fine_tune("base-r20"), headers=headers)
    assert first.status_code == 202, first.text
    job = first.json()
    assert job["source_job"] == str(source)
    assert job["spec"]["init"]["resolved"] == {
        "job_id": str(source),
        "model": "base-r20",
        "version": 1,
        "step": 40,
        "sha256": SHA256,
        "classes": None,
    }  # the checkpoint's server path stays on the server
    again = client.post(JOBS, json=_fine_tune("base-r20"), headers=headers)
    assert (again.status_code, again.json()["id"]) == (200, job["id"])
    assert job["id"] in queued_ids(queue)
