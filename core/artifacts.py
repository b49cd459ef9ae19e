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
