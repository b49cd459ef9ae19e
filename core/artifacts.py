"""The artifact store: where the service's files live, behind one module.

Every reader and writer of a job's files goes through here: the worker that trains into a
job's folder, the API that deletes it, prediction that opens only checkpoints the service
wrote. A worker trains into a local folder, `ARTIFACT_DIR`:

    ARTIFACT_DIR/jobs/<job id>/spec.json, summary.json, metrics.jsonl, checkpoints/...

With `ARTIFACT_STORE=local` (the default) that folder is the store, and a checkpoint row's
`path` is the file's absolute path. With `ARTIFACT_STORE=s3` each checkpoint is also put
to the bucket under `jobs/<job id>/checkpoints/<file>`, and its row's `path` is that
object key (relative; an absolute path is a file of the local store). The database
records each checkpoint's sha256; readers fetch and verify it before loading.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db.tables import Checkpoint
from core.settings import Settings
from core.storage import ObjectCorruptError, ObjectMissingError, check_key, store_for
from training import checkpoints
from training.checkpoints import CheckpointError

log = logging.getLogger(__name__)
JOBS = "jobs"


def root(settings: Settings) -> Path:
    """The store's folder, absolute."""
    return settings.artifact_dir.resolve()


def job_dir(settings: Settings, job_id: uuid.UUID) -> Path:
    """Where a job's files live (its checkpoints in `checkpoints/` inside)."""
    return root(settings) / JOBS / str(job_id)


def uses_bucket(settings: Settings) -> bool:
    """Whether artifacts live in an object store rather than in the local folder."""
    return settings.artifact_store == "s3"


def job_prefix(job_id: uuid.UUID) -> str:
    """The object key prefix of a job's artifacts."""
    return f"{JOBS}/{job_id}/"


def checkpoint_key(job_id: uuid.UUID, name: str) -> str:
    """The object key of one of a job's checkpoint files (`step-100.pt`)."""
    return f"{job_prefix(job_id)}{checkpoints.DIRECTORY}/{name}"


def job_file_key(job_id: uuid.UUID, name: str) -> str:
    """The object key of one of a job's result files (`predictions.csv`)."""
    return f"{job_prefix(job_id)}{name}"


def put_job_file(settings: Settings, job_id: uuid.UUID, path: Path, sha256: str) -> None:
    """Put a file of the job's folder to the object store; the local store holds it already.

    `StoreUnavailableError` when the store cannot be reached now."""
    if uses_bucket(settings):
        store_for(settings).put(job_file_key(job_id, path.name), path, sha256)


def is_key(path: str) -> bool:
    """Whether a checkpoint row's `path` is an object key (else a local store's file)."""
    return not Path(path).is_absolute()


def delete_job(settings: Settings, job_id: uuid.UUID) -> None:
    """Remove a job's local files, if this machine has any."""
    shutil.rmtree(job_dir(settings, job_id), ignore_errors=True)


def delete_job_objects(settings: Settings, job_id: uuid.UUID) -> int:
    """Delete a job's objects from the object store (none with the local store); how many.

    `StoreUnavailableError` when the store cannot be reached: the caller keeps the rows."""
    if not uses_bucket(settings):
        return 0
    return store_for(settings).delete_prefix(job_prefix(job_id))


def is_stored(settings: Settings, path: str | Path) -> bool:
    """Whether `path` lies in the store (only files the service wrote are ever opened): a
    file under `ARTIFACT_DIR`, or an object key under `jobs/`."""
    if is_key(str(path)):
        try:
            key = check_key(str(path))  # as the row holds it, never normalised
        except ValueError:
            return False
        return key.startswith(f"{JOBS}/")
    return Path(path).resolve().is_relative_to(root(settings))


def local_file(settings: Settings, path: str, sha256: str) -> Path:
    """A local file of a checkpoint row's `path`: the store's file, or the object fetched
    into the download cache and verified against `sha256`.

    `CheckpointError` when the object is missing or does not match; `StoreUnavailableError`
    (from `core.storage`) when the store cannot be reached now."""
    if not is_key(path):
        return Path(path)
    try:
        return store_for(settings).fetch(path, sha256)
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
    if stored and is_key(stored[0].path):
        return Path(stored[0].path), stored[0].step
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
