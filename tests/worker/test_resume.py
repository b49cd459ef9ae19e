"""Resuming from an object store: the newest recorded checkpoint that verifies is fetched
into a folder that lacks it, step files no row records are dropped, and a job whose rows
name local files resumes from them as before. (A LocalStore stands in for the bucket.)"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from core import layout
from core.storage import LocalStore
from training import checkpoints
from training.events import EventSink
from worker.homes import StoredHome
from worker.watchdog import Watchdog

JOB = uuid.uuid4()


class Sink:
    """What resuming uses of a sink: its watchdog and its events."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.watchdog = SimpleNamespace(
            lease_seconds=1,
            lost=threading.Event(),
            handing_back=False,
            claim=SimpleNamespace(job_id=JOB),
        )

    def on_event(self, level: str, message: str) -> None:
        self.events.append(f"{level}: {message}")


def stored(bucket: LocalStore, step: int, data: bytes) -> tuple[str, str]:
    """A checkpoint object of step `step` with bytes `data`: its key and sha256."""
    source = bucket.root.parent / f"source-{step}"
    source.write_bytes(data)
    key = layout.checkpoint_key(JOB, f"step-{step}.pt")
    sha256 = checkpoints.sha256_of(source)
    bucket.put(key, source, sha256)
    return key, sha256


@pytest.fixture
def bucket(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "bucket")


def fetch(folder: Path, recorded: dict[str, str], bucket: LocalStore, sink: Sink) -> dict[str, str]:
    home = StoredHome(bucket, cast(Watchdog, sink.watchdog))
    return home.fetch(folder, recorded, cast(EventSink, sink))


def test_the_newest_recorded_checkpoint_is_fetched_with_its_sha256_beside_it(
    bucket: LocalStore, tmp_path: Path
) -> None:
    older, newer = stored(bucket, 22, b"older"), stored(bucket, 44, b"newer")
    folder, sink = tmp_path / "worker" / "checkpoints", Sink()
    local = fetch(folder, dict([older, newer]), bucket, sink)

    assert sorted(path.name for path in folder.iterdir()) == ["step-44.pt", "step-44.sha256"]
    assert (folder / "step-44.pt").read_bytes() == b"newer"
    assert local[str(folder / "step-44.pt")] == newer[1]
    assert checkpoints.latest_verified(folder) == folder / "step-44.pt"  # by its sidecar
    assert sink.events == ["info: fetched step-44.pt from the object store"]


def test_a_corrupt_newest_object_falls_back_to_the_one_before(
    bucket: LocalStore, tmp_path: Path
) -> None:
    older, (key, _) = stored(bucket, 22, b"older"), stored(bucket, 44, b"newer")
    folder, sink = tmp_path / "worker" / "checkpoints", Sink()
    fetch(folder, {older[0]: older[1], key: "f" * 64}, bucket, sink)

    assert (folder / "step-22.pt").read_bytes() == b"older"
    assert not (folder / "step-44.pt").exists()
    assert sink.events[0].startswith("warning: cannot resume from step-44.pt")


def test_step_files_no_row_records_are_dropped_and_a_recorded_one_is_not_fetched_again(
    bucket: LocalStore, tmp_path: Path
) -> None:
    key, sha256 = stored(bucket, 22, b"recorded")
    folder = tmp_path / "worker" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "step-22.pt").write_bytes(b"recorded")
    (folder / "step-33.pt").write_bytes(b"written here, never recorded")
    sink = Sink()
    fetch(folder, {key: sha256}, bucket, sink)

    assert sorted(path.name for path in folder.iterdir()) == ["step-22.pt"]
    assert sink.events == []


def test_a_job_whose_rows_name_local_files_resumes_from_them(
    bucket: LocalStore, tmp_path: Path
) -> None:
    folder = tmp_path / "worker" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "step-33.pt").write_bytes(b"local")
    recorded = {str(folder / "step-33.pt"): "0" * 64}

    assert fetch(folder, recorded, bucket, Sink()) == recorded
    assert (folder / "step-33.pt").exists()
