"""The database sink: how a running job's metrics, events and checkpoints reach Postgres.

Every write carries the claim's fencing token (`core.jobs`), so a worker that lost its
lease writes nothing more. Metric points are buffered and written in batches.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.orm import Session

from core import jobs
from core.db.session import session_scope
from training import checkpoints
from training.checkpoints import CheckpointInfo
from worker.watchdog import Watchdog

FLUSH_SECONDS = 1.0  # a metric point waits at most this long before it is written...
FLUSH_POINTS = 500  # ...or until this many points are buffered


class DatabaseSink:
    """An `EventSink` writing metrics (in batches), events and checkpoints, all fenced."""

    def __init__(self, *, url: str, claim: jobs.Claim, watchdog: Watchdog) -> None:
        self.url, self.claim, self.watchdog = url, claim, watchdog
        self.pending: list[jobs.Point] = []
        self.flushed_at = time.monotonic()
        self.non_finite: set[str] = set()
        self.best: CheckpointInfo | None = None  # recorded as best.pt

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
        with self._session() as session:
            jobs.add_event(
                session=session,
                job_id=self.claim.job_id,
                level=level,
                message=message,
                token=self.claim.token,
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
        return watchdog.cancelled.is_set() or watchdog.lost.is_set() or watchdog.overtime

    def flush(self) -> None:
        """Write the buffered metric points in one fenced upsert."""
        self.flushed_at = time.monotonic()
        if not self.pending:
            return
        points, self.pending = self.pending, []
        with self._session() as session:
            jobs.write_metrics(
                session=session, job_id=self.claim.job_id, token=self.claim.token, points=points
            )

    def _record(self, info: CheckpointInfo) -> None:
        path, kept = recorded_path(info)
        with self._session() as session:
            jobs.record_checkpoint(
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

    def _check_lease(self) -> None:
        # Stop at once, writing nothing more: another delivery owns the job now.
        if self.watchdog.lost.is_set():
            raise jobs.LeaseLost(f"job {self.claim.job_id} lost its lease")

    @contextmanager
    def _session(self) -> Iterator[Session]:
        try:
            with session_scope(self.url) as session:
                yield session
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
