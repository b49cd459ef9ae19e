"""Where a job's checkpoints live: `CheckpointHome`, the one object the sink and resuming
ask, so neither asks which store it is.

- `LocalHome` (`ARTIFACT_STORE=local`): this machine's `ARTIFACT_DIR` is the store. A
  checkpoint's row names its file; the best is recorded as best.pt, which outlives the
  pruning of its step file.
- `StoredHome` (`ARTIFACT_STORE=s3`): each checkpoint, once written and hashed on this disk,
  is put under `jobs/<job id>/checkpoints/<file>` before its row names that key; objects no
  row names are deleted after the rows; a resumed job fetches the newest recorded
  checkpoint that verifies when this disk lacks it (it may have run elsewhere before).

A store that cannot be reached is retried with backoff for a lease
(`while_store_reachable`); then `StoreOutageError` stops the job, which is handed back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

from core import jobs, layout
from core.settings import Settings
from core.storage import (
    ObjectCorruptError,
    ObjectMissingError,
    Store,
    StoreError,
    StoreUnavailableError,
    copy_atomic,
    recorded_file,
    shared_store,
)
from training import checkpoints
from training.checkpoints import CheckpointInfo
from training.events import EventSink
from worker.watchdog import Watchdog

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_FIRST_S, RETRY_MAX_S = 0.1, 2.0  # backoff while the database or the store is unreachable


class StoreOutageError(RuntimeError):
    """The object store stayed unreachable for a whole lease."""


def with_backoff(
    watchdog: Watchdog,
    action: Callable[[], T],
    unreachable: type[Exception] | tuple[type[Exception], ...],
    give_up: Callable[[Exception, float], Exception | None],
    *,
    what: str,
) -> T:
    """Run `action`, retried with doubling delays while it raises `unreachable` (`what` is
    unreachable), until `give_up` (given the error and the next delay) returns the error
    to raise instead."""
    delay = RETRY_FIRST_S
    while True:
        try:
            return action()
        except unreachable as error:
            stop = give_up(error, delay)
            if stop is not None:
                raise stop from error
            log.warning(
                "job %s: %s unreachable; retry in %.1f s", watchdog.claim.job_id, what, delay
            )
            time.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_S)


def while_store_reachable(watchdog: Watchdog, action: Callable[[], T]) -> T:
    """Run `action`, retried with backoff while the object store is unreachable, for at most
    a lease from the first failure (the heartbeat keeps the lease meanwhile; the job is then
    handed back, to run again later, perhaps elsewhere)."""
    deadline = time.monotonic() + watchdog.lease_seconds

    def give_up(error: Exception, delay: float) -> Exception | None:
        if watchdog.lost.is_set():
            return jobs.LeaseLost(f"job {watchdog.claim.job_id} lost its lease")
        if time.monotonic() + delay > deadline or watchdog.handing_back:
            return StoreOutageError(
                f"the object store stayed unreachable for {watchdog.lease_seconds} s: {error}"
            )
        return None

    return with_backoff(watchdog, action, StoreUnavailableError, give_up, what="object store")


class CheckpointHome(Protocol):
    """Where a job's checkpoints live, beyond the files this machine writes them to."""

    def put(self, info: CheckpointInfo) -> None:
        """Keep a checkpoint just written and hashed in this machine's folder."""

    def record(self, info: CheckpointInfo, best: CheckpointInfo | None) -> tuple[str, list[str]]:
        """What a checkpoint's row names, and what the rows that stay name (`best`: the
        run's best so far)."""

    def forget(self, kept: set[str]) -> None:
        """Delete what is kept of the job's checkpoints that no row names any more."""

    def freed_by(self, path: Path, best: CheckpointInfo | None) -> int:
        """The stored bytes that deleting a step checkpoint frees."""

    def delete(self, path: Path, best: CheckpointInfo | None) -> None:
        """Delete a step checkpoint, here and wherever else it is kept."""

    def fetch(self, directory: Path, recorded: dict[str, str], sink: EventSink) -> dict[str, str]:
        """Make the folder hold what the job resumes from; the sha256 of each recorded
        checkpoint by the path it is checked at (`recorded`: by what its row names)."""


class LocalHome:
    """The local store: this machine's folder is where the checkpoints live."""

    def put(self, info: CheckpointInfo) -> None:
        """Nothing to do: the file is in the store already."""

    def record(self, info: CheckpointInfo, best: CheckpointInfo | None) -> tuple[str, list[str]]:
        """The file's path, and the files whose rows stay (`recorded_path`)."""
        path, kept = recorded_path(info)
        return str(path), kept

    def forget(self, kept: set[str]) -> None:
        """Nothing to do: the engine deleted the files of the rows that went."""

    def freed_by(self, path: Path, best: CheckpointInfo | None) -> int:
        """The file and its sidecar (the best's bytes stay in best.pt)."""
        sidecar = path.with_suffix(".sha256")
        return path.stat().st_size + (sidecar.stat().st_size if sidecar.is_file() else 0)

    def delete(self, path: Path, best: CheckpointInfo | None) -> None:
        """Delete the file and its sidecar."""
        delete_file(path)

    def fetch(self, directory: Path, recorded: dict[str, str], sink: EventSink) -> dict[str, str]:
        """Nothing to fetch: the rows name this folder's files."""
        return recorded


class StoredHome:
    """An object store apart from this machine: each checkpoint is put to it, and its row
    names the object's key."""

    def __init__(self, store: Store, watchdog: Watchdog) -> None:
        self.store, self.watchdog = store, watchdog
        self.job_id = watchdog.claim.job_id

    def key_of(self, path: Path) -> str:
        """The object key of one of the job's checkpoint files."""
        return layout.checkpoint_key(self.job_id, path.name)

    def put(self, info: CheckpointInfo) -> None:
        """Put the file to the store (retried while it is unreachable)."""
        key, store = self.key_of(info.path), self.store
        while_store_reachable(self.watchdog, lambda: store.put(key, info.path, info.sha256))

    def record(self, info: CheckpointInfo, best: CheckpointInfo | None) -> tuple[str, list[str]]:
        """The checkpoint's key, and the keys whose rows stay: the step files on this disk
        and the best's (whose object outlives the pruning of its file)."""
        steps = [self.key_of(path) for path in info.path.parent.glob("step-*.pt")]
        kept = [self.key_of(best.path)] if best is not None else []
        return self.key_of(info.path), [*steps, *kept]

    def forget(self, kept: set[str]) -> None:
        """Delete the job's checkpoint objects no row names (pruned, or put by an attempt
        that died before recording them); one left behind goes with the job."""
        store, prefix = self.store, layout.checkpoints_prefix(self.job_id)
        try:
            listed = while_store_reachable(self.watchdog, lambda: store.keys(prefix))
        except (StoreError, StoreOutageError) as error:
            log.warning("job %s: pruned checkpoints stay in the store: %s", self.job_id, error)
            return
        for key in sorted(set(listed) - kept):
            try:
                while_store_reachable(self.watchdog, partial(store.delete_prefix, key))
            except (StoreError, StoreOutageError) as error:
                log.warning("job %s: pruned %s stays in the store: %s", self.job_id, key, error)

    def freed_by(self, path: Path, best: CheckpointInfo | None) -> int:
        """Its object, unless the best's row names it."""
        return 0 if _is_best(path, best) else path.stat().st_size

    def delete(self, path: Path, best: CheckpointInfo | None) -> None:
        """Delete its object (unless the best's row names it), then its file here."""
        if not _is_best(path, best):
            key, store = self.key_of(path), self.store
            while_store_reachable(self.watchdog, lambda: store.delete_prefix(key))
        delete_file(path)

    def fetch(self, directory: Path, recorded: dict[str, str], sink: EventSink) -> dict[str, str]:
        """Keep the folder's recorded step files, fetch the newest recorded checkpoint that
        verifies when the folder lacks it; the sha256 of each by local path. (A job that
        began with the local store, its rows naming files, resumes from them as before.)"""
        if any(recorded_file(path) is not None for path in recorded):
            return recorded
        keys = {
            str(directory / f"step-{step_of(key)}.pt"): key for key in recorded if step_of(key) >= 0
        }
        local = {path: recorded[key] for path, key in keys.items()}
        for path in directory.glob("step-*.pt") if directory.is_dir() else []:
            if str(path) not in local:  # written here, never recorded: not the job's history
                delete_file(path)
        for target in sorted(local, key=step_of, reverse=True):
            if self._fetched(Path(target), keys[target], local[target], sink):
                break
        return local

    def _fetched(self, target: Path, key: str, sha256: str, sink: EventSink) -> bool:
        """Whether `target` holds the recorded checkpoint now: found verified here, or
        fetched; a missing or corrupt object is said and passed over."""
        if checkpoints.verifies(target, sha256):
            return True
        try:
            fetched = while_store_reachable(self.watchdog, partial(self.store.fetch, key, sha256))
        except (ObjectMissingError, ObjectCorruptError) as error:
            sink.on_event("warning", f"cannot resume from {target.name}: {error}")
            return False
        place(fetched, target, sha256)
        sink.on_event("info", f"fetched {target.name} from the object store")
        return True


def home_for(settings: Settings, watchdog: Watchdog) -> CheckpointHome:
    """The home of the claimed job's checkpoints under these settings."""
    store = shared_store(settings)
    return LocalHome() if store is None else StoredHome(store, watchdog)


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


def step_of(path: str) -> int:
    """The step of a checkpoint file or key named `step-N.pt`."""
    match = checkpoints.STEP_FILE.fullmatch(Path(path).name)
    return int(match[1]) if match is not None else -1


def place(fetched: Path, target: Path, sha256: str) -> None:
    """Copy a fetched checkpoint into the folder, with its `.sha256` beside it."""
    copy_atomic(fetched, target)
    checkpoints.write_atomic(target.with_suffix(".sha256"), f"{sha256}  {target.name}\n".encode())


def delete_file(path: Path) -> None:
    """Delete a step checkpoint's file and its sidecar, if there."""
    path.unlink(missing_ok=True)
    path.with_suffix(".sha256").unlink(missing_ok=True)


def _is_best(path: Path, best: CheckpointInfo | None) -> bool:
    """Whether `path` is the step file of the best, whose object the best's row names."""
    return best is not None and best.path.name == path.name
