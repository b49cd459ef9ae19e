"""The watchdog: a thread beside a running job that keeps its lease and its limits.

It renews the lease every `heartbeat_seconds` (recording progress), notices a cancel
request or a lost lease, and ends a job that overruns its hard time limit or ignores a
cancel for `CANCEL_GRACE_SECONDS`: it records the outcome and ends the process, which
frees the GPU.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from sqlalchemy.exc import SQLAlchemyError

from core import jobs
from core.db.session import session_scope
from core.settings import Settings
from worker.limits import ceiling

log = logging.getLogger(__name__)

CANCEL_GRACE_SECONDS = 30.0  # a job still running this long after a cancel is ended by force

# Set by SIGTERM in a job process (its worker is stopping): the job checkpoints and is handed
# back to the queue, to resume at once on another worker.
SHUTTING_DOWN = threading.Event()


class Watchdog(threading.Thread):
    """Renews the lease; notes cancel requests and a lost lease; ends a job that overruns."""

    def __init__(self, *, settings: Settings, claim: jobs.Claim) -> None:
        super().__init__(name=f"watchdog-{claim.job_id}", daemon=True)
        self.url, self.claim = settings.database_url, claim
        self.lease_seconds, self.interval = settings.lease_seconds, settings.heartbeat_seconds
        self.limits = ceiling(settings.max_job_seconds)  # until the budget is known
        self.progress: dict[str, int] = {}
        self.cancelled = threading.Event()
        self.lost = threading.Event()
        self.started = self.renewed = time.monotonic()
        self._cancel_seen: float | None = None
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval) and self.beat():
            self._enforce_limits()

    def stop(self) -> None:
        """Stop renewing (before the job's outcome is written)."""
        self._done.set()
        if self.is_alive():
            self.join()

    def beat(self) -> bool:
        """Renew the lease once; False when the lease is lost and the job must stop."""
        try:
            with session_scope(self.url) as session:
                cancel = jobs.heartbeat(
                    session=session,
                    job_id=self.claim.job_id,
                    token=self.claim.token,
                    lease_seconds=self.lease_seconds,
                    **self.progress,
                )
        except jobs.LeaseLost:
            self.lost.set()
        except SQLAlchemyError as error:
            log.warning("job %s: heartbeat failed: %s", self.claim.job_id, error)
            # Past the lease another worker may own the job: stop rather than race it.
            if time.monotonic() - self.renewed > self.lease_seconds:
                self.lost.set()
        else:
            self.renewed = time.monotonic()
            if cancel:
                self.cancelled.set()
        return not self.lost.is_set()

    @property
    def handing_back(self) -> bool:
        """Whether this process is stopping, so that the job must go back to the queue."""
        return SHUTTING_DOWN.is_set()

    @property
    def lease_left(self) -> float:
        """Seconds until the lease, as last renewed, runs out."""
        return self.renewed + self.lease_seconds - time.monotonic()

    @property
    def overtime(self) -> bool:
        """Whether the job is past its soft time limit."""
        return time.monotonic() - self.started > self.limits.soft_s

    def _enforce_limits(self) -> None:
        now = time.monotonic()
        if self.cancelled.is_set():
            self._cancel_seen = self._cancel_seen or now
            if now - self._cancel_seen > CANCEL_GRACE_SECONDS:
                self._end_process("cancelled", None)
        if now - self.started > self.limits.hard_s:
            limit = f"{self.limits.hard_s:.0f} s"
            self._end_process("failed", f"exceeded its hard time limit of {limit}; ended by force")

    def _end_process(self, status: str, error: str | None) -> None:
        """The job's thread is stuck: record the outcome and end this process (frees the GPU)."""
        log.error("job %s: stuck; ending its process as %s", self.claim.job_id, status)
        try:
            with session_scope(self.url) as session:
                jobs.finish(
                    session=session,
                    job_id=self.claim.job_id,
                    token=self.claim.token,
                    status=status,
                    error=error,
                )
        finally:
            os._exit(1)
