"""The database sink: how a running job's metrics, events and checkpoints reach Postgres.

Every write carries the claim's fencing token (`core.jobs`), so a worker that lost its
lease writes nothing more; its checkpoint files are fenced the same way
(`training.checkpoints.Fence`). Metric points are buffered and written in batches. While the
database is unreachable a write is retried with backoff for as long as the lease lasts; then
`DatabaseUnavailableError` stops the job, which is handed back rather than failed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy.orm import Session

from core import jobs
from core.db.session import UNAVAILABLE, session_scope
from training import checkpoints
from training.checkpoints import CheckpointInfo, Fence
from worker.watchdog import Watchdog

log = logging.getLogger(__name__)
T = TypeVar("T")

FLUSH_SECONDS = 1.0  # a metric point waits at most this long before it is written...
FLUSH_POINTS = 500  # ...or until this many points are buffered
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 2.0  # backoff of a write while the database is unreachable


class DatabaseUnavailableError(RuntimeError):
    """The database stayed unreachable for as long as the job's lease allowed."""


def while_leased(url: str, watchdog: Watchdog, write: Callable[[Session], T]) -> T:
    """Run `write` in a transaction, retried with backoff while the database is unreachable
    and the lease lasts (another worker may take the job after it)."""
    delay = RETRY_FIRST_S
    while True:
        try:
            with session_scope(url) as session:
                return write(session)
        except UNAVAILABLE as error:
            if watchdog.lease_left < delay:
                raise DatabaseUnavailableError(
                    f"the database stayed unreachable until the lease ran out: {error}"
                ) from error
            log.warning(
                "job %s: database unreachable; retry in %.1f s", watchdog.claim.job_id, delay
            )
            time.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_S)


class DatabaseSink:
    """An `EventSink` writing metrics (in batches), events and checkpoints, all fenced."""

    def __init__(self, *, url: str, claim: jobs.Claim, watchdog: Watchdog) -> None:
        self.url, self.claim, self.watchdog = url, claim, watchdog
        self.pending: list[jobs.Point] = []
        self.flushed_at = time.monotonic()
        self.non_finite: set[str] = set()
        self.best: CheckpointInfo | None = None  # recorded as best.pt
        self.fence: Fence | None = None  # the job folder's, once taken (the loop saves with it)

    def take_fence(self, directory: Path, *, wait_s: float) -> None:
        """Fence the checkpoint folder with this claim's token before resuming from it."""
        self.fence = Fence(directory, self.claim.token, confirm=self.confirm_owner, wait_s=wait_s)
        self.fence.take()

    def confirm_owner(self) -> None:
        """Renew the lease and write the buffered metrics, or raise: a checkpoint may follow."""
        self._check_lease()
        self.flush()
        self._write(
            lambda session: jobs.heartbeat(
                session=session,
                job_id=self.claim.job_id,
                token=self.claim.token,
                lease_seconds=self.watchdog.lease_seconds,
            )
        )
        self.watchdog.renewed = time.monotonic()

    def on_metrics(self, step: int, epoch: float, values: dict[str, float]) -> None:
        self._check_lease()
        for name, value in values.items():
            if math.isfinite(value):
                self.pending.append(jobs.Point(name, step, float(value), epoch))
            elif name not in self.non_finite:
                self.non_finite.add(name)
                self.on_event("warning", f"{name} is {value} at step {step}; not stored")
        if len(self.pending) >= FLUSH_POINTS:
            self.flush()

    def on_event(self, level: str, message: str) -> None:
        self._check_lease()
        self._write(
            lambda session: jobs.add_event(
                session=session,
                job_id=self.claim.job_id,
                level=level,
                message=message,
                token=self.claim.token,
            )
        )

    def on_checkpoint(self, info: CheckpointInfo) -> None:
        self._check_lease()
        self.flush()
        previous = self.best
        if info.is_best:
            self.best = info
            if previous is not None and previous.step != info.step and previous.path.is_file():
                # The replaced best lives on in its step file until the engine prunes it.
                self._record(dataclasses.replace(previous, is_best=False))
        self._record(info)

    def on_progress(self, step: int, total: int) -> None:
        self._check_lease()
        self.watchdog.progress = {"step": step, "total_steps": total}
        if time.monotonic() - self.flushed_at >= FLUSH_SECONDS:
            self.flush()

    def should_stop(self) -> bool:
        watchdog = self.watchdog
        stop = watchdog.cancelled.is_set() or watchdog.lost.is_set() or watchdog.handing_back
        return stop or watchdog.overtime

    def flush(self) -> None:
        """Write the buffered metric points in one fenced upsert."""
        self.flushed_at = time.monotonic()
        if not self.pending:
            return
        points, self.pending = self.pending, []
        self._write(
            lambda session: jobs.write_metrics(
                session=session, job_id=self.claim.job_id, token=self.claim.token, points=points
            )
        )

    def _record(self, info: CheckpointInfo) -> None:
        path, kept = recorded_path(info)
        self._write(
            lambda session: jobs.record_checkpoint(
                session=session,
                job_id=self.claim.job_id,
                token=self.claim.token,
                step=info.step,
                epoch=info.epoch,
                path=str(path),
                sha256=info.sha256,
                size=info.bytes,
                is_best=info.is_best,
                kept=kept,
            )
        )

    def _check_lease(self) -> None:
        # Stop at once, writing nothing more: another delivery owns the job now.
        if self.watchdog.lost.is_set():
            raise jobs.LeaseLost(f"job {self.claim.job_id} lost its lease")

    def _write(self, write: Callable[[Session], object]) -> None:
        """One fenced write, retried while the database is unreachable (`while_leased`)."""
        try:
            while_leased(self.url, self.watchdog, write)
        except jobs.LeaseLost:
            self.watchdog.lost.set()
            raise


def recorded_path(info: CheckpointInfo) -> tuple[Path, list[str]]:
    """The file a checkpoint's row names, and the files whose rows stay.

    One row per saved state. The best is recorded as best.pt, which outlives the pruning of
    its step file (a replaced best goes back to its step file); rows of pruned files go.
    """
    directory = info.path.parent
    steps = [str(path) for path in directory.glob("step-*.pt")]
    if info.is_best:
        return directory / checkpoints.BEST, steps
    return info.path, [*steps, str(directory / checkpoints.BEST)]
