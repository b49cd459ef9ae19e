"""The reaper: re-enqueue jobs whose worker died or whose message was lost.

Every worker's main process runs one in a thread. That needs no beat process, and it never
waits behind a training job on the queue (a reap task would, with one job per worker).
Reapers of several workers do not repeat each other: a job is re-enqueued only after a
conditional UPDATE takes it (`core.jobs.take_*`), once per lease period; and should a
message be duplicated anyway, the claim in the database keeps it from running twice.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

from sqlalchemy.orm import Session

from core import jobs, queue
from core.db.session import UNAVAILABLE, session_scope
from core.queue import enqueue
from core.settings import Settings
from core.studies import service as studies

log = logging.getLogger(__name__)

# A queued job untouched this many lease periods, beyond the messages waiting on the broker,
# has lost its message (say, Redis restarted empty): the reaper enqueues it again.
MESSAGE_LOST_AFTER_LEASES = 2


def interval(settings: Settings) -> float:
    """Seconds between reaper passes: a third of the lease."""
    return max(1.0, settings.lease_seconds / 3)


def reap_once(settings: Settings) -> list[uuid.UUID]:
    """One pass: end abandoned cancels, re-enqueue expired and lost jobs, start the held jobs
    of studies with room (say, after a job failed for good); returns their ids."""
    try:
        # Asked first, with a timeout: a broker that is down (or restarting) must not hold
        # the locks this pass takes, and nothing could be enqueued anyway.
        waiting = queue.depth(settings, timeout=settings.probe_timeout_seconds)
    except Exception as error:  # any broker failure: the next pass tries again
        log.warning("reaper: the broker is unreachable, pass skipped: %s", error)
        return []
    # No pooled connection may outlive a pass: prefork children fork from this process.
    with session_scope(settings.database_url, pooled=False) as session:
        jobs.cancel_abandoned(session=session)
        expired = jobs.take_expired(session=session, lease_seconds=settings.lease_seconds)
        # Queued jobs beyond the messages waiting lost theirs (say, Redis restarted empty).
        lost = jobs.take_stale_queued(
            session=session,
            older_than_s=MESSAGE_LOST_AFTER_LEASES * settings.lease_seconds,
            limit=jobs.count_queued(session=session) - waiting,
        )
        for job_id in expired:
            _note(session, job_id, "lease expired (worker died or hung): re-enqueued")
        for job_id in lost:
            _note(session, job_id, "no worker took it in time (message lost?): re-enqueued")
        released = [
            job_id
            for study_id in studies.studies_with_held_jobs(session=session)
            for job_id in studies.release(session=session, settings=settings, study_id=study_id)
        ]
        taken = [*expired, *lost, *released]
        # Read here, in this pass's unpooled session: a pool would be forked into the jobs.
        queues = queue.queues_in(session, taken)
    for job_id in taken:
        enqueue(job_id, settings=settings, queue=queues.get(job_id, queue.QUEUE))
    return taken


def _note(session: Session, job_id: uuid.UUID, message: str) -> None:
    jobs.add_event(session=session, job_id=job_id, level="warning", message=message)
    log.warning("job %s: %s", job_id, message)


class Reaper(threading.Thread):
    """Runs `reap_once` every `interval(settings)` seconds until stopped; `beat` (the
    worker's heartbeat in the register), when set, runs before each pass."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(name="reaper", daemon=True)
        self.settings = settings
        self.beat: Callable[[], None] | None = None
        self._done = threading.Event()

    def run(self) -> None:
        seconds = interval(self.settings)
        while not self._done.is_set():
            try:
                if self.beat is not None:
                    self.beat()
                reap_once(self.settings)
            except UNAVAILABLE as error:
                log.warning(
                    "reaper: the database is unreachable; next try in %.0f s: %s", seconds, error
                )
            except Exception:
                log.exception("reaper pass failed; next try in %.0f s", seconds)
            self._done.wait(seconds)

    def stop_soon(self) -> None:
        """Ask it to stop after the current pass, without waiting."""
        self._done.set()

    def stop(self) -> None:
        """Stop after the current pass."""
        self._done.set()
        if self.is_alive():
            self.join(timeout=30)
