"""The database sink: how a running job's metrics, events and checkpoints reach Postgres.

Every write carries the claim's fencing token (`core.jobs`), so a worker that lost its
lease writes nothing more; its checkpoint files are fenced the same way
(`training.checkpoints.Fence`). Metric points are buffered and written in batches. While the
database is unreachable a write is retried with backoff for as long as the lease lasts; then
`DatabaseUnavailableError` stops the job, which is handed back rather than failed. A write
that finds the database unreachable once the lease has run out (the process was paused past
it) raises `LeaseLost`: another worker may own the job by then.

Each checkpoint goes to its `CheckpointHome` (`worker.homes`) before its row names it: the
local folder that is the store, or an object store (`ARTIFACT_STORE=s3`) it is put to, whose
objects of pruned checkpoints are deleted after their rows. A store that cannot be reached
is retried with backoff for a lease; then `StoreOutageError` stops the job, which is handed
back too.

Under the folder's lock, before each checkpoint is written, the owner's artifact budget
(`MAX_ARTIFACT_BYTES_PER_OWNER`, `core.usage`) must leave room for it: else the run's own
older step checkpoints go, oldest first, beyond `keep_last` if need be, and when even
that leaves too little the run fails with `ArtifactBudgetError` before writing anything
(its newest checkpoint and the best stay). After each checkpoint the job's stored bytes are
measured onto its row.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from core import jobs, usage
from core.db.session import UNAVAILABLE, session_scope
from core.settings import Settings
from core.studies import search
from training import checkpoints
from training.checkpoints import CheckpointInfo, Fence
from worker.homes import CheckpointHome, LocalHome, with_backoff
from worker.watchdog import Watchdog

log = logging.getLogger(__name__)
T = TypeVar("T")

FLUSH_SECONDS = 1.0  # a metric point waits at most this long before it is written...
FLUSH_POINTS = 500  # ...or until this many points are buffered


class DatabaseUnavailableError(RuntimeError):
    """The database stayed unreachable for as long as the job's lease allowed."""


class ArtifactBudgetError(RuntimeError):
    """The owner's artifact budget leaves no room for the run's next checkpoint."""


@dataclass(frozen=True)
class OwnerBudget:
    """What a run's checkpoints are measured and held against: the job's owner, the
    settings' budget and store, and the estimated size of a checkpoint before one is seen."""

    settings: Settings
    owner: uuid.UUID | None
    checkpoint_estimate: int


def while_leased(url: str, watchdog: Watchdog, write: Callable[[Session], T]) -> T:
    """Run `write` in a transaction, retried with backoff while the database is unreachable
    and the lease lasts (another worker may take the job after it)."""

    def attempt() -> T:
        with session_scope(url) as session:
            return write(session)

    def give_up(error: Exception, delay: float) -> Exception | None:
        if watchdog.lease_left <= 0:
            # Past its lease (a process paused, then resumed) another worker may own the
            # job, as the watchdog finds too: the lease is lost, whatever the database says.
            return jobs.LeaseLost(f"job {watchdog.claim.job_id} lost its lease")
        if watchdog.lease_left < delay:
            return DatabaseUnavailableError(
                f"the database stayed unreachable until the lease ran out: {error}"
            )
        return None

    return with_backoff(watchdog, attempt, UNAVAILABLE, give_up, what="database")


class DatabaseSink:
    """An `EventSink` writing metrics (in batches), events and checkpoints, all fenced."""

    def __init__(
        self,
        *,
        url: str,
        claim: jobs.Claim,
        watchdog: Watchdog,
        home: CheckpointHome | None = None,
        budget: OwnerBudget | None = None,
        judge: search.Judge | None = None,
    ) -> None:
        self.url, self.claim, self.watchdog = url, claim, watchdog
        self.judge = judge  # a search trial's pruner, judging each point of its objective
        self.pruned: str | None = None  # why the pruner stopped the run, once it did
        self.home = home or LocalHome()  # where the checkpoints live beside this disk
        self.budget = budget  # None: checkpoints are neither measured nor held to a budget
        self.checkpoint_bytes: int | None = None  # the last checkpoint's, once one is written
        self.pruned_to_fit = False  # whether the budget made this run prune a checkpoint
        self.pending: list[jobs.Point] = []
        self.flushed_at = time.monotonic()
        self.non_finite: set[str] = set()
        self.best: CheckpointInfo | None = None  # recorded as best.pt
        self.fence: Fence | None = None  # the job folder's, once taken (the loop saves with it)

    def take_fence(self, directory: Path, *, wait_s: float) -> None:
        """Fence the checkpoint folder with this claim's token before resuming from it."""
        self.fence = Fence(
            directory, self.claim.token, confirm=self.before_checkpoint, wait_s=wait_s
        )
        self.fence.take()

    def before_checkpoint(self) -> None:
        """Under the folder's lock, before a checkpoint is written: confirm the lease, then
        make room for the checkpoint within the owner's artifact budget."""
        self.confirm_owner()
        if self.budget is not None and self.budget.settings.max_artifact_bytes_per_owner:
            self._make_room(self.budget)

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
        if self.judge is not None and self.pruned is None:
            judged = values.get(self.judge.metric)
            if judged is not None and math.isfinite(judged):
                self._judge(step, judged)

    def _judge(self, step: int, value: float) -> None:
        """Ask the search's pruner about this point; a pruned run stops at its next check.
        A pruner that cannot be asked (the database is away) lets the run go on."""
        judge = self.judge
        assert judge is not None
        try:
            with session_scope(self.url) as session:
                reason = judge.prunes(session, step, value)
        except Exception as error:
            log.warning(
                "job %s: its pruner was not asked at step %s: %s", self.claim.job_id, step, error
            )
            return
        if reason is not None:
            self.pruned = reason
            self.on_event("info", reason)

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
        self.home.put(info)
        previous = self.best
        if info.is_best:
            self.best = info
            if previous is not None and previous.step != info.step and previous.path.is_file():
                # The replaced best lives on in its step file until the engine prunes it.
                self._record(dataclasses.replace(previous, is_best=False))
        self._record(info)
        self.checkpoint_bytes = info.bytes
        if self.budget is not None:
            self._record_usage(self.budget.settings)

    def on_run_record(self, data: dict[str, Any] | None, environment: dict[str, Any]) -> None:
        """Write the data's provenance and the environment to the job's row (fenced)."""
        self._check_lease()
        self._write(
            lambda session: jobs.record_run(
                session=session,
                job_id=self.claim.job_id,
                token=self.claim.token,
                data=data,
                environment=environment,
            )
        )

    def on_progress(self, step: int, total: int) -> None:
        self._check_lease()
        self.watchdog.progress = {"step": step, "total_steps": total}
        if time.monotonic() - self.flushed_at >= FLUSH_SECONDS:
            self.flush()

    def should_stop(self) -> bool:
        watchdog = self.watchdog
        stop = watchdog.cancelled.is_set() or watchdog.lost.is_set() or watchdog.handing_back
        return stop or watchdog.overtime or self.pruned is not None

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
        """Write the checkpoint's row (and drop the rows of pruned ones), then let its home
        forget what no row names."""
        path, kept = self.home.record(info, self.best)
        self._write(
            lambda session: jobs.record_checkpoint(
                session=session,
                job_id=self.claim.job_id,
                token=self.claim.token,
                step=info.step,
                epoch=info.epoch,
                path=path,
                sha256=info.sha256,
                size=info.bytes,
                is_best=info.is_best,
                kept=kept,
            )
        )
        self.home.forget({path, *kept})

    def _make_room(self, budget: OwnerBudget) -> None:
        """Prune the run's own older step checkpoints, oldest first, until the next one fits
        in what the owner's other files leave; `ArtifactBudgetError` (nothing pruned) when
        even the newest alone leaves too little."""
        settings, job_id = budget.settings, self.claim.job_id
        assert self.fence is not None
        directory = self.fence.directory
        size = self.checkpoint_bytes or budget.checkpoint_estimate
        # The step file, and best.pt beside it when there is none yet (a first is the best).
        needed = size if (directory / checkpoints.BEST).is_file() else 2 * size
        others = self._write(
            lambda session: usage.of_owner(
                session=session,
                settings=settings,
                owner=budget.owner,
                except_job=job_id,
                measure=False,  # the rows' figures: no store round trip before a checkpoint
            )
        )
        own = self._measure(settings)
        room = others.limit - others.bytes
        if own + needed <= room:
            return
        older = [(path, self.home.freed_by(path, self.best)) for path in step_files(directory)[:-1]]
        if own - sum(freed for _, freed in older) + needed > room:
            kept = dataclasses.replace(others, job_bytes=others.job_bytes + own)
            raise ArtifactBudgetError(
                f"the next checkpoint (about {usage.mib(needed)}) does not fit in the owner's "
                f"artifact budget even with only this job's newest checkpoint kept: "
                f"{usage.describe(kept)}, {usage.mib(own)} of them this job's; its checkpoints "
                "so far are kept: delete jobs or exports you no longer need (or raise "
                f"{usage.SETTING}), then retry the job"
            )
        pruned = []
        for path, freed in older:
            if own + needed <= room:
                break
            self.home.delete(path, self.best)  # its row goes with the next record
            own -= freed
            pruned.append(path.name)
        if self.pruned_to_fit:  # said once a run: later prunes are the same story
            log.info("job %s: pruned %s to fit its budget", job_id, ", ".join(pruned))
            return
        self.pruned_to_fit = True
        self.on_event(
            "warning",
            f"pruned {', '.join(pruned)} (beyond recipe.keep_last if need be) to keep the "
            f"owner's artifacts within {usage.SETTING} ({usage.mib(others.limit)}); older "
            "checkpoints go the same way as newer ones are written",
        )

    def _measure(self, settings: Settings) -> int:
        """The bytes the job's files take now, counted on this machine's disk, where each is
        written (and pruned) before (and with) its object: no store round trip per checkpoint."""
        return usage.folder_bytes(settings, self.claim.job_id)

    def _record_usage(self, settings: Settings) -> None:
        """Write the job's stored bytes to its row (fenced)."""
        measured = self._measure(settings)
        self._write(
            lambda session: usage.record_running(
                session=session, job_id=self.claim.job_id, token=self.claim.token, measured=measured
            )
        )

    def _check_lease(self) -> None:
        # Stop at once, writing nothing more: another delivery owns the job now.
        if self.watchdog.lost.is_set():
            raise jobs.LeaseLost(f"job {self.claim.job_id} lost its lease")

    def _write(self, write: Callable[[Session], T]) -> T:
        """One fenced write, retried while the database is unreachable (`while_leased`)."""
        try:
            return while_leased(self.url, self.watchdog, write)
        except jobs.LeaseLost:
            self.watchdog.lost.set()
            raise


def step_files(directory: Path) -> list[Path]:
    """A folder's step checkpoints, oldest first."""
    found = [
        (int(match[1]), path)
        for path in directory.glob("step-*.pt")
        if (match := checkpoints.STEP_FILE.fullmatch(path.name)) is not None
    ]
    return [path for _, path in sorted(found)]
