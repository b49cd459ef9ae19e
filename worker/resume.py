"""Resuming a job: only from a checkpoint whose sha256 matches what the database recorded.

Before a (re)run, the job's checkpoint folder is fenced with its claim's token, the newest
step checkpoints that fail their check are set aside as `*.corrupt` until one passes, and
the sink learns which checkpoint an earlier attempt recorded as the best.

The job's `CheckpointHome` (`worker.homes`) makes the folder hold what it resumes from:
with an object store the database is the truth, step files of this disk that no row
records go, and the newest recorded checkpoint whose object verifies is fetched into the
folder when this disk lacks it (the job may have run on another machine before).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import select

from core import artifacts
from core.db.session import session_scope
from core.db.tables import Checkpoint
from core.settings import Settings
from training import checkpoints
from training.checkpoints import CheckpointInfo
from training.events import EventSink
from worker.sink import DatabaseSink


def prepare(settings: Settings, job_id: uuid.UUID, sink: DatabaseSink) -> None:
    """Fence the job's checkpoint folder, keep its latest verified checkpoint to resume from,
    and tell the sink the best."""
    directory = artifacts.job_dir(settings, job_id) / checkpoints.DIRECTORY
    # An earlier attempt that still runs (paused past its lease) can write nothing after this.
    sink.take_fence(directory, wait_s=settings.lease_seconds)
    recorded = sink.home.fetch(directory, recorded_sha256(settings, job_id), sink)
    keep_verified_latest(directory, recorded, sink)
    sink.best = recorded_best(settings, job_id, directory)


def recorded_sha256(settings: Settings, job_id: uuid.UUID) -> dict[str, str]:
    """The sha256 the database holds for each of a job's checkpoint files."""
    with session_scope(settings.database_url) as session:
        rows = session.execute(
            select(Checkpoint.path, Checkpoint.sha256).where(Checkpoint.job_id == job_id)
        ).all()
    return {path: sha256 for path, sha256 in rows}


def recorded_best(settings: Settings, job_id: uuid.UUID, directory: Path) -> CheckpointInfo | None:
    """The best checkpoint an earlier attempt recorded, as its step file."""
    with session_scope(settings.database_url) as session:
        row = artifacts.find_checkpoint(session=session, job_id=job_id, which="best")
        if row is None:
            return None
        path = directory / f"step-{row.step}.pt"
        return CheckpointInfo(path, row.sha256, row.bytes, row.step, row.epoch, is_best=True)


def keep_verified_latest(directory: Path, recorded: dict[str, str], sink: EventSink) -> None:
    """Set aside the newest step checkpoints that fail their sha256 check, until one passes."""
    checkpoints.latest_verified(directory, recorded, lambda line: sink.on_event("warning", line))
