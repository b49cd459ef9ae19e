"""Resuming a job: only from a checkpoint whose sha256 matches what the database recorded.

Before a (re)run, the job's checkpoint folder is fenced with its claim's token, the newest
step checkpoints that fail their check are set aside as `*.corrupt` until one passes, and
the sink learns which checkpoint an earlier attempt recorded as the best.

With an object store the database is the truth: step files of this disk that no row
records go, and the newest recorded checkpoint whose object verifies is fetched into the
folder when this disk lacks it (the job may have run on another machine before).
"""

from __future__ import annotations

import uuid
from functools import partial
from pathlib import Path

from sqlalchemy import select

from core import artifacts
from core.db.session import session_scope
from core.db.tables import Checkpoint
from core.settings import Settings
from core.storage import ObjectCorruptError, ObjectMissingError, Store, copy_atomic, recorded_file
from training import checkpoints
from training.checkpoints import CheckpointInfo
from training.events import EventSink
from worker.sink import DatabaseSink, while_store_reachable


def prepare(settings: Settings, job_id: uuid.UUID, sink: DatabaseSink) -> None:
    """Fence the job's checkpoint folder, keep its latest verified checkpoint to resume from,
    and tell the sink the best."""
    directory = artifacts.job_dir(settings, job_id) / checkpoints.DIRECTORY
    # An earlier attempt that still runs (paused past its lease) can write nothing after this.
    sink.take_fence(directory, wait_s=settings.lease_seconds)
    recorded = recorded_sha256(settings, job_id)
    if sink.store is not None:
        recorded = fetch_latest(directory, recorded, sink.store, sink)
    keep_verified_latest(directory, recorded, sink)
    sink.best = recorded_best(settings, job_id, directory)


def recorded_sha256(settings: Settings, job_id: uuid.UUID) -> dict[str, str]:
    """The sha256 the database holds for each of a job's checkpoint files."""
    with session_scope(settings.database_url) as session:
        rows = session.execute(
            select(Checkpoint.path, Checkpoint.sha256).where(Checkpoint.job_id == job_id)
        ).all()
    return {path: sha256 for path, sha256 in rows}


def fetch_latest(
    directory: Path, recorded: dict[str, str], store: Store, sink: DatabaseSink
) -> dict[str, str]:
    """Keep the folder's recorded step files, fetch the newest recorded checkpoint that
    verifies when the folder lacks it; the sha256 of each by local path. (A job that
    began with the local store, its rows naming files, resumes from them as before.)"""
    if any(recorded_file(path) is not None for path in recorded):
        return recorded
    stored = dict(recorded)
    keys = {str(directory / f"step-{step_of(key)}.pt"): key for key in stored if step_of(key) >= 0}
    local = {path: stored[key] for path, key in keys.items()}
    for path in directory.glob("step-*.pt") if directory.is_dir() else []:
        if str(path) not in local:  # written here, never recorded: not the job's history
            path.unlink(missing_ok=True)
            path.with_suffix(".sha256").unlink(missing_ok=True)
    for target in sorted(local, key=lambda path: step_of(path), reverse=True):
        sha256 = local[target]
        if checkpoints.verifies(Path(target), sha256):
            return local
        try:
            fetched = while_store_reachable(
                sink.watchdog, partial(store.fetch, keys[target], sha256)
            )
        except (ObjectMissingError, ObjectCorruptError) as error:
            sink.on_event("warning", f"cannot resume from {Path(target).name}: {error}")
            continue
        place(fetched, Path(target), sha256)
        sink.on_event("info", f"fetched {Path(target).name} from the object store")
        return local
    return local


def step_of(path: str) -> int:
    """The step of a checkpoint file or key named `step-N.pt`."""
    match = checkpoints.STEP_FILE.fullmatch(Path(path).name)
    return int(match[1]) if match is not None else -1


def place(fetched: Path, target: Path, sha256: str) -> None:
    """Copy a fetched checkpoint into the folder, with its `.sha256` beside it."""
    copy_atomic(fetched, target)
    checkpoints.write_atomic(target.with_suffix(".sha256"), f"{sha256}  {target.name}\n".encode())


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
