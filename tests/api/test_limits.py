"""Per-caller limits: submits within a token bucket (429 + Retry-After), open event streams
per key (429) and in total (503), and each stream's maximum life."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.ratelimit import TokenBuckets
from core.settings import Settings
from tests.helpers import FakeClock, make_key, new_job, wait_for
from tests.services import serve

API = "/api/v1"
DRY_RUN = f"{API}/studies?dry_run=true"  # a submit that writes nothing
STUDY = {
    "base": {"model": {"name": "resnet20"}, "dataset": {"name": "digits"}},
    "grid": {"model.name": ["plain20", "resnet20"]},
}


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_bucket_allows_its_burst_then_its_rate() -> None:
    clock = FakeClock()
    buckets = TokenBuckets(rate_per_s=0.5, burst=2, clock=clock)
    assert [buckets.take("a"), buckets.take("a")] == [0.0, 0.0]
    assert buckets.take("a") == pytest.approx(2.0)  # one token every 2 s
    assert buckets.take("b") == 0.0  # another caller has a bucket of its own
    clock.advance(1.0)
    assert buckets.take("a") == pytest.approx(1.0)
    clock.advance(1.0)
    assert buckets.take("a") == 0.0
    clock.advance(60.0)  # refilled up to the burst, not beyond
    assert [buckets.take("a") for _ in range(3)][-1] == pytest.approx(2.0)


@pytest.fixture(scope="module")
def limited(settings: Settings) -> Iterator[TestClient]:
    """An app allowing bursts of 3 submits, then one every ten minutes, per key."""
    tight = settings.model_copy(
        update={"rate_limit_submits_per_minute": 0.1, "rate_limit_submit_burst": 3}
    )
    with TestClient(create_app(tight)) as client:
        yield client


def test_a_submit_flood_gets_429_with_retry_after_per_key(
    limited: TestClient, settings: Settings
) -> None:
    flooding, other = (_bearer(make_key(settings.database_url, "read", "train")) for _ in range(2))
    answers = [limited.post(DRY_RUN, json=STUDY, headers=flooding) for _ in range(4)]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 429]
    refused = answers[-1]
    # A token every 600 s, less the time the three submits took.
    assert 300 <= int(refused.headers["Retry-After"]) <= 600
    error = refused.json()["error"]
    assert error["code"] == "too_many_requests"
    assert "RATE_LIMIT_SUBMITS_PER_MINUTE" in error["message"]
    assert limited.post(DRY_RUN, json=STUDY, headers=other).status_code == 200
    # Reads are not submits.
    assert limited.get(f"{API}/studies/presets", headers=flooding).status_code == 200


def test_retries_and_other_enqueuing_routes_share_the_submit_limit(
    limited: TestClient, settings: Settings
) -> None:
    key = _bearer(make_key(settings.database_url, "admin"))  # the job has no owner
    job = new_job(settings.database_url)
    retries = []
    for _ in range(4):  # each cycle puts the job back on the queue
        assert limited.post(f"{API}/jobs/{job}/cancel", headers=key).status_code < 300
        retries.append(limited.post(f"{API}/jobs/{job}/retry", headers=key).status_code)
    assert retries == [202, 202, 202, 429]
    # Imports and exports enqueue work too: they are refused before their bodies are read.
    for path in ("registry/any/versions/import", "registry/any/versions/1/exports"):
        refused = limited.post(f"{API}/{path}", headers=key, json={})
        assert refused.status_code == 429, path
        assert "Retry-After" in refused.headers
    schema = limited.get("/openapi.json").json()["paths"]
    assert "429" in schema[f"{API}/jobs/{{job_id}}/retry"]["post"]["responses"]


def test_with_auth_off_submits_are_limited_per_client_address(settings: Settings) -> None:
    loose = settings.model_copy(
        update={
            "auth_enabled": False,
            "rate_limit_submits_per_minute": 0.1,
            "rate_limit_submit_burst": 1,
        }
    )
    with TestClient(create_app(loose), base_url="http://127.0.0.1:8000") as client:
        assert client.post(DRY_RUN, json=STUDY).status_code == 200
        refused = client.post(DRY_RUN, json=STUDY)
    assert refused.status_code == 429
    assert 300 <= int(refused.headers["Retry-After"]) <= 600


def test_a_rate_of_zero_turns_the_limit_off(settings: Settings) -> None:
    free = settings.model_copy(
        update={"rate_limit_submits_per_minute": 0, "rate_limit_submit_burst": 1}
    )
    key = _bearer(make_key(settings.database_url, "train"))
    with TestClient(create_app(free)) as client:
        statuses = {client.post(DRY_RUN, json=STUDY, headers=key).status_code for _ in range(3)}
    assert statuses == {200}


# --- event streams ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def streams_url(settings: Settings) -> Iterator[str]:
    """The app with one stream per key and two in all, served."""
    bounded = settings.model_copy(update={"stream_max_per_key": 1, "stream_max_total": 2})
    with serve(create_app(bounded)) as url:
        yield url


@pytest.fixture(scope="module")
def short_streams_url(settings: Settings) -> Iterator[str]:
    """The app with event streams that live a second, served."""
    with serve(create_app(settings.model_copy(update={"stream_max_seconds": 1}))) as url:
        yield url


def _reopened(events: str, headers: dict[str, str]) -> bool:
    """Whether a stream opens again (once the server noticed the last one was closed)."""
    with httpx.stream("GET", events, headers=headers, timeout=60) as response:
        return response.status_code == 200


def _events_url(base: str, settings: Settings) -> str:
    return f"{base}{API}/jobs/{new_job(settings.database_url)}/events"


def test_streams_are_bounded_per_key_and_in_total(streams_url: str, settings: Settings) -> None:
    first, second, third = (_bearer(make_key(settings.database_url, "read")) for _ in range(3))
    events = _events_url(streams_url, settings)
    timeout = httpx.Timeout(60)
    with (
        httpx.stream("GET", events, headers=first, timeout=timeout) as opened,
        httpx.stream("GET", events, headers=second, timeout=timeout) as also,
    ):
        assert (opened.status_code, also.status_code) == (200, 200)
        again = httpx.get(events, headers=first, timeout=timeout)
        assert again.status_code == 429
        assert again.headers["Retry-After"] == "5"
        assert "STREAM_MAX_PER_KEY" in again.json()["error"]["message"]
        full = httpx.get(events, headers=third, timeout=timeout)
        assert full.status_code == 503
        assert full.headers["Retry-After"] == "5"
        assert "STREAM_MAX_TOTAL" in full.json()["error"]["message"]
    # Closed by the client: the server frees their slots (noticed at its next write).
    wait_for(lambda: _reopened(events, first) or None, 60, "a freed stream slot", every=1)


def test_a_stream_ends_cleanly_at_its_maximum_life(
    short_streams_url: str, settings: Settings
) -> None:
    key = _bearer(make_key(settings.database_url, "read"))
    events = _events_url(short_streams_url, settings)  # a queued job: it never ends by itself
    started = time.monotonic()
    with httpx.stream("GET", events, headers=key, timeout=60) as response:
        body = response.read().decode()  # a clean end of the body, no transport error
    took = time.monotonic() - started
    assert took >= 1
    assert "event: status" in body
    assert "event: end" not in body  # the job is not over: the client reconnects
