"""Checkpoints: written atomically with a sha256, read back only with `weights_only=True`.

A checkpoint is a dict of tensors, numbers, strings, lists and dicts (nothing a pickle
could execute): model, optimizer and scaler state, step, epoch, RNG state, the run's spec,
the data's normalisation and class names, and the loop's running-metric window.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import pickle
import re
import shutil
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

STEP_FILE = re.compile(r"step-(\d+)\.pt")
BEST = "best.pt"
DIRECTORY = "checkpoints"  # a run folder's checkpoints live here
FENCE_FILE, LOCK_FILE = ".fence", ".lock"
# Free space a checkpoint write leaves beyond its own size (CHECKPOINT_FREE_MARGIN_BYTES).
FREE_MARGIN_BYTES = 64 * 2**20


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupted, or not what the database says it is."""


class DiskFullError(OSError):
    """Too little free disk space for a checkpoint: refused before anything was written."""


class FencedOutError(CheckpointError):
    """A newer owner holds the folder's fence: this writer may not touch its files."""


class FolderLockedError(FencedOutError):
    """Another writer held the folder's lock past the wait: say, an earlier owner frozen
    (SIGSTOP, a hung host) in the middle of a save. It may never let go while frozen."""


@dataclass(frozen=True)
class Fence:
    """A checkpoint folder's fencing token on disk: only its holder writes, prunes or moves best.

    The service's next attempt of a job `take`s the fence with the job's (larger) fencing
    token before it resumes; every save of an earlier attempt then fails its check, under an
    exclusive lock of the folder, even if that attempt was paused (SIGSTOP) past its lease.
    `confirm` runs under the lock before any file is touched (the service renews the lease
    there and writes the metrics up to the checkpoint's step, or raises).
    """

    directory: Path
    token: int
    confirm: Callable[[], None] | None = None
    wait_s: float = 60.0  # how long `take` waits for a writer that holds the lock

    def take(self) -> None:
        """Make this token the folder's; FencedOutError if a newer one holds it or the lock."""
        with self._locked(self.wait_s):
            if self._holder() > self.token:
                raise FencedOutError(
                    f"{self.directory} is fenced by a newer token {self._holder()}"
                )
            write_atomic(self.directory / FENCE_FILE, f"{self.token}\n".encode())

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the folder's lock while its token is still this one's (FencedOutError otherwise)."""
        with self._locked(self.wait_s):
            if self._holder() != self.token:
                raise FencedOutError(
                    f"{self.directory} is fenced by token {self._holder()}, not {self.token}: "
                    "a newer attempt owns it"
                )
            if self.confirm is not None:
                self.confirm()
            yield

    def _holder(self) -> int:
        with suppress(FileNotFoundError, ValueError):
            return int((self.directory / FENCE_FILE).read_text().strip())
        return 0

    @contextmanager
    def _locked(self, wait_s: float) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + wait_s
        with (self.directory / LOCK_FILE).open("a") as lock:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise FolderLockedError(
                            f"{self.directory} stayed locked by another writer for {wait_s:.0f} s"
                        ) from None
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass(frozen=True)
class CheckpointInfo:
    """Where a checkpoint lies and what it holds, as recorded next to the run."""

    path: Path
    sha256: str
    bytes: int
    step: int
    epoch: int
    is_best: bool


def sha256_of(path: Path) -> str:
    """The sha256 hex digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new, never a part."""
    write_all({path: data})


def write_all(files: dict[Path, bytes]) -> None:
    """Write each file atomically, and none unless every one was staged in full.

    Every file is first written whole to a temporary file beside it (a full disk fails
    here, and the temporary files go); only then are they renamed into place.
    """
    staged: dict[Path, Path] = {}
    try:
        for path, data in files.items():
            staged[path] = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            with staged[path].open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        for path, tmp in staged.items():
            os.replace(tmp, path)
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)  # gone once renamed
    # The renames themselves are durable only once the directory entries are on disk.
    for directory in {path.parent for path in files}:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def ensure_free_space(directory: Path, needed: int, margin: int, name: str) -> None:
    """Raise `DiskFullError` unless `needed` bytes plus `margin` are free where `directory` is."""
    free = shutil.disk_usage(directory).free
    if free < needed + margin:
        raise DiskFullError(
            f"not enough free disk space to write checkpoint {name}: it needs {needed:,} "
            f"bytes and a margin of {margin:,} (CHECKPOINT_FREE_MARGIN_BYTES), {free:,} are "
            "free; the checkpoints written before are intact: free some space, then resume"
        )


def save(
    directory: Path,
    state: dict[str, Any],
    *,
    is_best: bool,
    keep_last: int,
    fence: Fence | None = None,
    free_margin: int = FREE_MARGIN_BYTES,
) -> CheckpointInfo:
    """Save `state` as `step-N.pt` (and `best.pt`), with a `.sha256` beside each file.

    With a `fence`, nothing is written or pruned unless the fence is still held. Without
    the checkpoint's size plus `free_margin` free on its disk, `DiskFullError` and nothing
    written; a write that still runs out of space leaves the files as they were.
    """
    directory.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    path = directory / f"step-{state['step']}.pt"
    files: dict[Path, bytes] = {}
    for target in [path, directory / BEST] if is_best else [path]:
        files[target] = data
        files[target.with_suffix(".sha256")] = f"{digest}  {target.name}\n".encode()
    ensure_free_space(directory, sum(map(len, files.values())), free_margin, path.name)
    with fence.held() if fence is not None else _unfenced():
        write_all(files)
        _prune(directory, keep_last)
    return CheckpointInfo(path, digest, len(data), state["step"], state["epoch"], is_best)


@contextmanager
def _unfenced() -> Iterator[None]:
    yield


def _prune(directory: Path, keep_last: int) -> None:
    """Remove all but the newest `keep_last` step checkpoints (best.pt is its own copy)."""
    for old in step_files(directory)[:-keep_last]:
        old.unlink(missing_ok=True)
        old.with_suffix(".sha256").unlink(missing_ok=True)


def step_files(directory: Path) -> list[Path]:
    """The step checkpoints in `directory`, oldest step first; none when it is missing."""
    if not directory.is_dir():
        return []
    steps = [
        (int(m.group(1)), p)
        for p in directory.glob("step-*.pt")
        if (m := STEP_FILE.fullmatch(p.name)) is not None
    ]
    return [path for _, path in sorted(steps)]


def step_of(path: Path) -> int:
    """The step of a checkpoint file named `step-N.pt`."""
    match = STEP_FILE.fullmatch(path.name)
    if match is None:
        raise ValueError(f"{path.name} is not a step checkpoint")
    return int(match[1])


def latest(directory: Path) -> Path | None:
    """The step checkpoint with the highest step in `directory`, if any."""
    steps = step_files(directory)
    return steps[-1] if steps else None


def latest_verified(
    directory: Path,
    recorded: Mapping[str, str] | None = None,
    warn: Callable[[str], None] = lambda _: None,
    *,
    set_aside: bool = True,
) -> Path | None:
    """The checkpoint a run in `directory` resumes from: the newest step checkpoint whose
    sha256 matches its record (`recorded`, by path, wins over the sidecar).

    Newer ones that fail are set aside as `*.corrupt`, each with a `warn`; with
    `set_aside=False` they are only passed over (a reader's view: nothing moves).
    """
    passed_over = False
    for newest in reversed(step_files(directory)):
        problem = _verification_problem(newest, (recorded or {}).get(str(newest)))
        if problem is None:
            return newest
        passed_over = True
        if set_aside:
            aside = newest.with_name(f"{newest.name}.corrupt")
            newest.replace(aside)
            warn(f"{newest.name} {problem}; set aside as {aside.name}")
    if passed_over and set_aside:
        warn("no verified checkpoint is left: starting over from step 0")
    return None


def verifies(path: Path, expected: str | None = None) -> bool:
    """Whether `path` is a file a run may resume from: its sha256 is `expected` (else its
    sidecar's)."""
    return path.is_file() and _verification_problem(path, expected) is None


def _verification_problem(path: Path, expected: str | None) -> str | None:
    """Why `path` cannot be resumed from, or None when its sha256 matches the record."""
    expected = expected or _recorded_sha256(path)
    if expected is None:
        return "has no recorded sha256"
    if sha256_of(path) != expected:
        return f"does not match its recorded sha256 {expected[:12]}..."
    return None


def load(path: Path, *, sha256: str | None = None) -> dict[str, Any]:
    """Load a checkpoint after checking its sha256 (given, or from the `.sha256` beside it)."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    expected = sha256 or _recorded_sha256(path)
    if expected is not None and sha256_of(path) != expected:
        raise CheckpointError(
            f"checkpoint {path} is corrupted: its sha256 differs from the recorded {expected}"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError) as error:
        raise CheckpointError(f"checkpoint {path} cannot be read: {error}") from error
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a checkpoint of this service")
    return state


def _recorded_sha256(path: Path) -> str | None:
    sidecar = path.with_suffix(".sha256")
    return sidecar.read_text().split()[0] if sidecar.is_file() else None
