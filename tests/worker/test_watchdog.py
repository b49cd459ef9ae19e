"""The watchdog called directly on Postgres: its beats renew the lease and record progress,
hear a cancel, and notice a lease another worker took or a database gone past the lease."""

from __future__ import annotations

import uuid

from core import jobs
from core.db.session import session_scope
from core.settings import Settings
from tests.helpers import job, new_job, wait_for
from worker.watchdog import Watchdog

NOWHERE = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"  # no server listens there


def _claimed(settings: Settings, lease: int = 60) -> jobs.Claim:
    job_id = new_job(settings.database_url)
    with session_scope(settings.database_url) as session:
        held = jobs.claim(
            session=session, job_id=job_id, worker="w", device="cpu", lease_seconds=lease
        )
    assert held is not None
    return held


def _cancel(url: str, job_id: uuid.UUID) -> None:
    with session_scope(url) as session:
        jobs.request_cancel(session=session, job_id=job_id)


def test_a_beat_renews_the_lease_and_records_progress(settings: Settings) -> None:
    url = settings.database_url
    claim = _claimed(settings, lease=5)
    before = job(url, claim.job_id).lease_expires_at
    watchdog = Watchdog(settings=settings, claim=claim)  # the settings' lease: 60 s
    watchdog.progress = {"step": 7, "total_steps": 10}

    assert watchdog.beat()

    row = job(url, claim.job_id)
    assert before is not None
    assert row.lease_expires_at is not None
    assert row.lease_expires_at > before
    assert (row.step, row.total_steps) == (7, 10)
    assert not watchdog.cancelled.is_set()
    assert watchdog.lease_left > settings.lease_seconds - 5


def test_a_beat_hears_a_cancel_request(settings: Settings) -> None:
    claim = _claimed(settings)
    watchdog = Watchdog(settings=settings, claim=claim)
    _cancel(settings.database_url, claim.job_id)

    assert watchdog.beat()  # the job stops of itself, at its next check
    assert watchdog.cancelled.is_set()


def test_a_beat_with_a_taken_over_lease_says_stop(settings: Settings) -> None:
    url = settings.database_url
    stale = _claimed(settings, lease=-1)  # expired at once
    with session_scope(url) as session:
        fresh = jobs.claim(
            session=session, job_id=stale.job_id, worker="w2", device="cpu", lease_seconds=60
        )
    assert fresh is not None

    watchdog = Watchdog(settings=settings, claim=stale)
    assert not watchdog.beat()
    assert watchdog.lost.is_set()
    assert Watchdog(settings=settings, claim=fresh).beat()


def test_an_unreachable_database_stops_the_job_only_once_the_lease_is_past(
    settings: Settings,
) -> None:
    claim = _claimed(settings)
    watchdog = Watchdog(settings=settings.model_copy(update={"database_url": NOWHERE}), claim=claim)

    assert watchdog.beat()  # renewed a moment ago: the job goes on
    assert not watchdog.lost.is_set()
    watchdog.renewed -= settings.lease_seconds + 1  # the last renewal is past the lease
    assert not watchdog.beat()
    assert watchdog.lost.is_set()


def test_the_thread_beats_every_heartbeat_until_stopped(settings: Settings) -> None:
    url = settings.database_url
    claim = _claimed(settings, lease=5)
    fast = settings.model_copy(update={"heartbeat_seconds": 0.05})
    watchdog = Watchdog(settings=fast, claim=claim)
    watchdog.progress = {"step": 1}
    watchdog.start()
    try:
        wait_for(lambda: job(url, claim.job_id).step == 1, 30, "the first beat")
        _cancel(url, claim.job_id)
        assert watchdog.cancelled.wait(30)
    finally:
        watchdog.stop()
    assert not watchdog.is_alive()
    assert not watchdog.lost.is_set()


def test_a_job_past_its_soft_limit_is_in_overtime(settings: Settings) -> None:
    watchdog = Watchdog(settings=settings, claim=_claimed(settings))
    assert not watchdog.overtime
    watchdog.started -= settings.max_job_seconds + 1
    assert watchdog.overtime
