"""A job's artifacts: its files on this machine, and what the store keeps of them.

Every reader and writer of a job's files goes through here: the worker that trains into a
job's folder, the API that deletes it, prediction that opens only checkpoints the service
wrote. A worker trains into a local folder, `ARTIFACT_DIR`, in the keys' layout
(`core.layout`):

    ARTIFACT_DIR/jobs/<job id>/spec.json, summary.json, metrics.jsonl, checkpoints/...

With `ARTIFACT_STORE=local` (the default) that folder is the store, and a checkpoint row's
`path` is the file's absolute path. With `ARTIFACT_STORE=s3` each checkpoint is also put
to the bucket under `jobs/<job id>/checkpoints/<file>`, and its row's `path` is that
object key. The store reads either (`core.storage`); the database records each
checkpoint's sha256, and readers fetch and verify it before loading.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from core import layout
from core.db.tables import Checkpoint
from core.settings import Settings
from core.storage import ObjectCorruptError, ObjectMissingError, recorded_file, store_for
from training import checkpoints
from training.checkpoints import CheckpointError

log = logging.getLogger(__name__)


def root(settings: Settings) -> Path:
    """The store's folder, absolute."""
    return settings.artifact_dir.resolve()


def job_dir(settings: Settings, job_id: uuid.UUID) -> Path:
    """Where a job's files live (its checkpoints in `checkpoints/` inside)."""
    return layout.job_dir(root(settings), job_id)


def put_job_file(settings: Settings, job_id: uuid.UUID, path: Path, sha256: str) -> None:
    """Store a file of the job's folder (the local store holds it there already).

    `StoreUnavailableError` when the store cannot be reached now."""
    store_for(settings).put(layout.job_file_key(job_id, path.name), path, sha256)


def delete_job(settings: Settings, job_id: uuid.UUID) -> None:
    """Remove a job's local files, if this machine has any."""
    shutil.rmtree(job_dir(settings, job_id), ignore_errors=True)


def delete_job_objects(settings: Settings, job_id: uuid.UUID) -> int:
    """Delete the objects a store keeps of a job apart from this machine's files (none in
    the local store: `delete_job` removes those); how many.

    `StoreUnavailableError` when the store cannot be reached: the caller keeps the rows."""
    return store_for(settings).delete_shared(layout.job_prefix(job_id))


def release_job(settings: Settings, job_id: uuid.UUID) -> None:
    """Remove this machine's copies of an ended job's files where the store keeps them
    apart (they would only fill its disk); the local store's files stay."""
    store_for(settings).release(layout.job_prefix(job_id))


def is_stored(settings: Settings, path: str | Path) -> bool:
    """Whether `path` lies in the store (only files the service wrote are ever opened): a
    job's object key, or a file of one under `ARTIFACT_DIR`."""
    key = store_for(settings).key_of(str(path))
    return key is not None and layout.is_job_key(key)


def local_file(settings: Settings, path: str, sha256: str) -> Path:
    """A local file of a checkpoint row's `path`: the store's file, or the object fetched
    into the download cache and verified against `sha256`.

    `CheckpointError` when the object is missing or does not match; `StoreUnavailableError`
    (from `core.storage`) when the store cannot be reached now."""
    try:
        return store_for(settings).local_path(path, sha256)
    except (ObjectMissingError, ObjectCorruptError) as error:
        raise CheckpointError(str(error)) from error


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
    picks it. Checkpoints in the object store are verified by the worker that fetches them:
    here the newest recorded one is named."""
    stored = session.execute(
        select(Checkpoint.path, Checkpoint.step)
        .where(Checkpoint.job_id == job_id)
        .order_by(Checkpoint.step.desc())
    ).all()
    if stored and recorded_file(stored[0].path) is None:
        return Path(stored[0].path), stored[0].step
    directory = job_dir(settings, job_id) / checkpoints.DIRECTORY
    rows = session.execute(
        select(Checkpoint.path, Checkpoint.sha256).where(Checkpoint.job_id == job_id)
    )
    recorded = {path: sha256 for path, sha256 in rows}
    # The worker's rule, without setting anything aside: a reader moves no file.
    path = checkpoints.latest_verified(directory, recorded, set_aside=False)
    return None if path is None else (path, checkpoints.step_of(path))
