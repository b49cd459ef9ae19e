"""Concurrent requests against a served API on Postgres: one Idempotency-Key makes one job;
registrations and alias moves of one model never answer 500."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier

import httpx
from sqlalchemy import func, select

from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests.helpers import TRAIN, make_key, trained_job

CLIENTS = 20


def _all_at_once(
    request: Callable[[httpx.Client], httpx.Response], client: httpx.Client
) -> list[httpx.Response]:
    """`CLIENTS` threads send `request` together (a barrier lines them up)."""
    start = Barrier(CLIENTS)

    def send(_: int) -> httpx.Response:
        start.wait(30)
        return request(client)

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(send, range(CLIENTS)))


def _client(live_url: str, settings: Settings, *scopes: str) -> httpx.Client:
    key = make_key(settings.database_url, *scopes)
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=CLIENTS)
    return httpx.Client(base_url=f"{live_url}/api/v1", headers=headers, timeout=60, limits=limits)


def test_concurrent_submits_with_one_idempotency_key_make_one_job(
    live_url: str, settings: Settings
) -> None:
    key = f"race-{uuid.uuid4().hex}"
    with _client(live_url, settings, "read", "train") as client:
        answers = _all_at_once(
            lambda c: c.post("/jobs", json=TRAIN, headers={"Idempotency-Key": key}), client
        )
    statuses = Counter(answer.status_code for answer in answers)
    assert set(statuses) <= {200, 202}, [a.text for a in answers if a.status_code >= 300]
    assert statuses[202] == 1
    assert len({answer.json()["id"] for answer in answers}) == 1
    with session_scope(settings.database_url) as session:
        made = session.scalar(select(func.count()).where(Job.idempotency_key == key))
    assert made == 1


def test_concurrent_registrations_of_one_name_number_versions_in_turn(
    live_url: str, settings: Settings
) -> None:
    job_id = trained_job(settings)
    name = f"race-{uuid.uuid4().hex[:8]}"
    body = {"job": str(job_id), "checkpoint": "best"}
    with _client(live_url, settings, "read", "train") as client:
        answers = _all_at_once(lambda c: c.post(f"/registry/{name}/versions", json=body), client)
        statuses = Counter(answer.status_code for answer in answers)
        assert statuses == {201: CLIENTS}, [a.text for a in answers if a.status_code != 201]
        versions = sorted(answer.json()["version"] for answer in answers)
        assert versions == list(range(1, CLIENTS + 1))

        # Moving one new alias to different versions at once: each move succeeds in turn.
        moves = iter(range(1, CLIENTS + 1))
        moved = _all_at_once(
            lambda c: c.put(f"/registry/{name}/aliases/live", json={"version": next(moves)}),
            client,
        )
        assert {answer.status_code for answer in moved} == {200}, [a.text for a in moved]
        # Deleting one version at once: one succeeds, the others find it gone.
        deleted = _all_at_once(lambda c: c.delete(f"/registry/{name}/versions/{CLIENTS}"), client)
    statuses = Counter(answer.status_code for answer in deleted)
    assert set(statuses) <= {204, 404, 409}, [a.text for a in deleted]
