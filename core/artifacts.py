"""The artifact store: where the service's files live, behind one module.

Every reader and writer of a job's files goes through here: the worker that trains into a
job's folder, the API that deletes it, prediction that opens only checkpoints the service
wrote. Today the store is a local folder, `ARTIFACT_DIR`:

    ARTIFACT_DIR/jobs/<job id>/spec.json, summary.json, metrics.jsonl, checkpoints/...

The database records each checkpoint's path and sha256; readers verify the sha256.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db.tables import Checkpoint
from core.settings import Settings
from training import checkpoints

JOBS = "jobs"


def root(settings: Settings) -> Path:
    """The store's folder, absolute."""
    return settings.artifact_dir.resolve()


def job_dir(settings: Settings, job_id: uuid.UUID) -> Path:
    """Where a job's files live (its checkpoints in `checkpoints/` inside)."""
    return root(settings) / JOBS / str(job_id)


def delete_job(settings: Settings, job_id: uuid.UUID) -> None:
    """Remove a job's files, if it has any."""
    shutil.rmtree(job_dir(settings, job_id), ignore_errors=True)


def is_stored(settings: Settings, path: str | Path) -> bool:
    """Whether `path` lies in the store (only files the service wrote are ever opened)."""
    return Path(path).resolve().is_relative_to(root(settings))


def find_checkpoint(*, session: Session, job_id: uuid.UUID, which: str | int) -> Checkpoint | None:
    """A job's checkpoint row: "best", "last" (highest step) or the one at a step number."""
    query = select(Checkpoint).where(Checkpoint.job_id == job_id)
    if which == "best":
        query = query.where(Checkpoint.is_best.is_(True))
    elif which != "last":
        query = query.where(Checkpoint.step == int(which))
    return session.scalars(query.order_by(Checkpoint.step.desc()).limit(1)).first()


def last_verified(
    *, session: Session, settings: Settings, job_id: uuid.UUID
) -> tuple[Path, int] | None:
    """The job's newest step checkpoint whose sha256 matches its record (the database's, or
    the `.sha256` beside it), and its step: what its next run resumes from, as the worker
    picks it."""
    directory = job_dir(settings, job_id) / checkpoints.DIRECTORY
    if not directory.is_dir():
        return None
    rows = session.execute(
        select(Checkpoint.path, Checkpoint.sha256).where(Checkpoint.job_id == job_id)
    )
    recorded = {path: sha256 for path, sha256 in rows}
    steps = [
        (int(match[1]), path)
        for path in directory.glob("step-*.pt")
        if (match := checkpoints.STEP_FILE.fullmatch(path.name)) is not None
    ]
    for step, path in sorted(steps, reverse=True):
        sidecar = path.with_suffix(".sha256")
        expected = recorded.get(str(path)) or (
            sidecar.read_text().split()[0] if sidecar.is_file() else None
        )
        if expected is not None and checkpoints.sha256_of(path) == expected:
            return path, step
    return None
