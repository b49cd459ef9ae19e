"""Run a claimed job to its outcome: the plain function behind the Celery task.

A job runs in the prefork child that took its message: claim it, start its watchdog
(`worker.watchdog`), verify what it resumes from (`worker.resume`), run its kind
(`core.kinds`) reporting through the fenced `DatabaseSink` (`worker.sink`), and write the
outcome (`worker.outcomes`). A job whose worker is stopping (SIGTERM), or whose database
stayed unreachable for its whole lease, is handed back to the queue instead: it resumes at
once on another worker from the checkpoint it saved on the way out. Its checkpoints are held
to its owner's artifact budget (`worker.sink`); once it ends, its stored bytes are measured
onto its row (`core.usage`).
"""

from __future__ import annotations

import logging
import uuid

import torch

from core import artifacts, jobs, kinds, uploads, usage
from core.db.session import UNAVAILABLE, session_scope
from core.db.tables import Job
from core.queue import enqueue_committed
from core.settings import Settings
from core.storage import StoreUnavailableError
from core.studies import search
from core.studies import service as studies
from training.checkpoints import FencedOutError, FolderLockedError
from training.data import LoadedDataset
from training.devices import default_device
from training.environment import environment
from worker import outcomes, resume
from worker.homes import StoreOutageError, home_for, while_store_reachable
from worker.limits import time_limits
from worker.outcomes import Outcome
from worker.sink import DatabaseSink, DatabaseUnavailableError, OwnerBudget, while_leased
from worker.watchdog import Watchdog

HANDED_BACK = "queued"  # the status of a job handed back; its outcome is written elsewhere

log = logging.getLogger(__name__)


def pick_device(settings: Settings) -> torch.device:
    """`settings.device`, else the first visible GPU, else the CPU (one worker per GPU)."""
    return torch.device(settings.device) if settings.device else default_device()


def execute(job_id: uuid.UUID, *, settings: Settings, worker: str) -> None:
    """Claim the job and run it to its outcome; a delivery that cannot claim returns at once."""
    device = pick_device(settings)
    with session_scope(settings.database_url) as session:
        claim = jobs.claim(
            session=session,
            job_id=job_id,
            worker=worker,
            device=str(device),
            lease_seconds=settings.lease_seconds,
        )
    if claim is None:
        log.info("job %s: not claimable (running elsewhere, or ended); skipped", job_id)
        return
    watchdog = Watchdog(settings=settings, claim=claim)
    sink = DatabaseSink(
        url=settings.database_url,
        claim=claim,
        watchdog=watchdog,
        home=home_for(settings, watchdog),
        budget=owner_budget(settings, job_id),
        judge=judge_of(settings, job_id),
    )
    watchdog.start()
    try:
        outcome = run_claimed(claim, settings=settings, sink=sink, device=device)
        sink.flush()
    except FolderLockedError as error:
        # An earlier owner froze mid-save, holding the folder: no failure of this job's,
        # and waiting here would hold a worker. Back to the queue, to try again later.
        log.warning("job %s: %s", job_id, error)
        outcome = Outcome(HANDED_BACK, error="an earlier attempt still holds its checkpoints")
    except (jobs.LeaseLost, FencedOutError) as error:
        log.warning("job %s: lease lost; another delivery owns it now (%s)", job_id, error)
        return
    except (DatabaseUnavailableError, *UNAVAILABLE) as error:
        # An outage is nobody's fault: the job goes back to the queue, never fails for it.
        log.warning("job %s: the database is unreachable: %s", job_id, error)
        outcome = Outcome(HANDED_BACK, error="the database was unreachable")
    except (StoreOutageError, StoreUnavailableError) as error:
        log.warning("job %s: the object store is unreachable: %s", job_id, error)
        outcome = Outcome(HANDED_BACK, error="the object store was unreachable")
    except Exception as error:
        outcome = outcomes.failure(error)
        _flush_quietly(sink)
    finally:
        watchdog.stop()
    if outcome.status == HANDED_BACK:
        _hand_back(settings, watchdog, outcome.error or "its worker is stopping")
        return
    _record_usage(settings, job_id)  # before its status: an ended job shows its figure
    outcomes.record(settings, claim, outcome, watchdog.progress)
    artifacts.release_job(settings, job_id)  # its files in a bucket: this disk's copies go
    _release_study(settings, job_id)


def judge_of(settings: Settings, job_id: uuid.UUID) -> search.Judge | None:
    """The pruner's judge of a search trial's job (None for any other job)."""
    with session_scope(settings.database_url) as session:
        return search.Judge.of_job(session, job_id)


def owner_budget(settings: Settings, job_id: uuid.UUID) -> OwnerBudget:
    """The budget a job's checkpoints are held to: its owner's, and the size its spec
    suggests for a checkpoint (a train job's; other kinds write none)."""
    with session_scope(settings.database_url) as session:
        job = session.get(Job, job_id)
        assert job is not None, "a claimed job exists"
        owner, kind, spec = job.owner_key_id, job.kind, job.spec
    trained = kinds.training_of(kind, spec)
    estimate = usage.checkpoint_estimate(trained) if trained is not None else 0
    return OwnerBudget(settings, owner, estimate)


def _record_usage(settings: Settings, job_id: uuid.UUID) -> None:
    """Measure the ended job's stored files (its result files too) onto its row."""
    try:
        with session_scope(settings.database_url) as session:
            usage.record_job(session=session, settings=settings, job_id=job_id)
    except Exception as error:
        log.warning("job %s: its stored bytes are not measured: %s", job_id, error)


def run_claimed(
    claim: jobs.Claim, *, settings: Settings, sink: DatabaseSink, device: torch.device
) -> Outcome:
    """Run a claimed job of any kind from its last verified checkpoint; returns its outcome."""
    with session_scope(settings.database_url) as session:
        job = session.get(Job, claim.job_id)
        assert job is not None, "a claimed job exists"
        kind, spec_json = kinds.get(job.kind), job.spec
    resume.prepare(settings, claim.job_id, sink)
    watchdog = sink.watchdog
    # An uploaded dataset lives in the object store until this machine unpacks it.
    while_store_reachable(watchdog, lambda: uploads.materialize(settings, spec_json.get("dataset")))

    def set_budget(steps: int, macs_per_step: float) -> None:
        watchdog.limits = time_limits(steps, macs_per_step, device, settings.max_job_seconds)

    def set_data(data: LoadedDataset) -> None:
        provenance = data.provenance.to_record() if data.provenance is not None else None
        sink.on_run_record(provenance, environment(device))

    context = kinds.RunContext(claim.job_id, settings, device, sink, set_budget, set_data)
    summary = kind.run(kind.parse(spec_json, settings), context)  # within this worker's budgets
    if summary.get("stopped") and watchdog.handing_back and not watchdog.cancelled.is_set():
        return Outcome(HANDED_BACK, summary)
    return outcomes.of_run(summary, watchdog, pruned=sink.pruned)


def _hand_back(settings: Settings, watchdog: Watchdog, reason: str) -> None:
    """Put the job back in the queue and enqueue it, so that another worker resumes it now."""
    claim = watchdog.claim
    try:
        while_leased(
            settings.database_url,
            watchdog,
            lambda session: jobs.hand_back(
                session=session, job_id=claim.job_id, token=claim.token, reason=reason
            ),
        )
    except (jobs.LeaseLost, DatabaseUnavailableError) as error:
        # Another worker owns it, or the lease runs out and the reaper re-enqueues it.
        log.warning("job %s: not handed back: %s", claim.job_id, error)
        return
    log.warning("job %s: handed back (%s)", claim.job_id, reason)
    enqueue_committed([claim.job_id], settings=settings)


def _release_study(settings: Settings, job_id: uuid.UUID) -> None:
    """Start the next held jobs of the job's study, if it has one (the reaper retries)."""
    try:
        with session_scope(settings.database_url) as session:
            released = studies.release_after(session=session, settings=settings, job_id=job_id)
        enqueue_committed(released, settings=settings)
    except Exception as error:
        log.warning("job %s: could not release its study's next jobs: %s", job_id, error)


def _flush_quietly(sink: DatabaseSink) -> None:
    """Write what the failed run buffered, if the database lets us."""
    try:
        sink.flush()
    except Exception as error:
        log.warning("job %s: could not write buffered metrics: %s", sink.claim.job_id, error)
