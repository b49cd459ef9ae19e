"""Resuming a job: only from a checkpoint whose sha256 matches what the database recorded.

Before a (re)run, the newest step checkpoints that fail their check are set aside as
`*.corrupt` until one passes, and the sink learns which checkpoint an earlier attempt
recorded as the best.
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
    """Keep the job's latest verified checkpoint to resume from; tell the sink the best."""
    directory = artifacts.job_dir(settings, job_id) / checkpoints.DIRECTORY
    keep_verified_latest(directory, recorded_sha256(settings, job_id), sink)
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
    set_aside = False
    while (latest := checkpoints.latest(directory) if directory.is_dir() else None) is not None:
        problem = _verification_problem(latest, recorded.get(str(latest)))
        if problem is None:
            return
        aside = latest.with_name(f"{latest.name}.corrupt")
        latest.replace(aside)
        set_aside = True
        sink.on_event("warning", f"{latest.name} {problem}; set aside as {aside.name}")
    if set_aside:
        sink.on_event("warning", "no verified checkpoint is left: starting over from step 0")


def _verification_problem(path: Path, expected: str | None) -> str | None:
    """Why `path` cannot be resumed from, or None when its sha256 matches the record."""
    sidecar = path.with_suffix(".sha256")
    if expected is None and sidecar.is_file():
        expected = sidecar.read_text().split()[0]
    if expected is None:
        return "has no recorded sha256"
    if checkpoints.sha256_of(path) != expected:
        return f"does not match its recorded sha256 {expected[:12]}..."
    return None
