"""Checkpoint folders are fenced: an earlier owner writes nothing once a newer one took over;
a run stopped between checkpoints keeps its last steps and resumes exactly."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path
from typing import IO

import pytest
import torch

from tests.training.test_loop import _history, _spec
from training import checkpoints
from training.checkpoints import Fence, FencedOutError
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions


def _state(step: int) -> dict[str, object]:
    return {"model": {"w": torch.full((4,), float(step))}, "step": step, "epoch": 0}


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".lock"}


def test_an_older_token_cannot_write_prune_or_move_best(tmp_path: Path) -> None:
    old, new = Fence(tmp_path, token=1), Fence(tmp_path, token=2)
    old.take()
    checkpoints.save(tmp_path, _state(10), is_best=True, keep_last=1, fence=old)
    new.take()
    before = _snapshot(tmp_path)

    # keep_last=1 would prune step-10, is_best would replace best.pt: neither happens.
    with pytest.raises(FencedOutError, match="token 2, not 1"):
        checkpoints.save(tmp_path, _state(20), is_best=True, keep_last=1, fence=old)
    assert _snapshot(tmp_path) == before
    assert checkpoints.load(tmp_path / "best.pt")["step"] == 10
    with pytest.raises(FencedOutError, match="newer token 2"):
        old.take()

    checkpoints.save(tmp_path, _state(20), is_best=True, keep_last=1, fence=new)
    assert checkpoints.latest(tmp_path) == tmp_path / "step-20.pt"
    assert not (tmp_path / "step-10.pt").exists()


def test_a_writer_holding_the_lock_finishes_before_the_fence_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release, refused = threading.Event(), threading.Event(), threading.Event()
    flock = fcntl.flock

    def seen_flock(lock: IO[str], operation: int) -> None:  # tells when a taker is refused
        try:
            flock(lock, operation)
        except BlockingIOError:
            refused.set()
            raise

    def slow_confirm() -> None:  # a writer paused inside its save, the lock held
        entered.set()
        release.wait(5)

    old = Fence(tmp_path, token=1, confirm=slow_confirm)
    old.take()
    writer = threading.Thread(
        target=checkpoints.save,
        args=(tmp_path, _state(10)),
        kwargs={"is_best": False, "keep_last": 2, "fence": old},
    )
    writer.start()
    assert entered.wait(5)
    with pytest.raises(FencedOutError, match="stayed locked"):
        Fence(tmp_path, token=2, wait_s=0.2).take()
    monkeypatch.setattr(fcntl, "flock", seen_flock)
    taker = threading.Thread(target=Fence(tmp_path, token=2).take)
    taker.start()
    assert refused.wait(5)  # it tried the lock, and waits for the writer
    assert taker.is_alive()
    assert (tmp_path / ".fence").read_text() == "1\n"
    release.set()
    writer.join(5)
    taker.join(5)
    assert (tmp_path / ".fence").read_text() == "2\n"
    assert checkpoints.load(tmp_path / "step-10.pt")["step"] == 10


def test_a_stop_between_checkpoints_keeps_the_steps_and_resumes_exactly(tmp_path: Path) -> None:
    spec = _spec()  # checkpoints at 4 and 8
    data = load_dataset(spec.dataset, data_root=tmp_path)
    whole = RecordingSink()
    fit(spec, data, RunOptions(out_dir=tmp_path / "whole"), whole)

    first = RecordingSink(stop_at=3)
    assert fit(spec, data, RunOptions(out_dir=tmp_path / "split"), first)["steps"] == 3
    saved = tmp_path / "split" / "checkpoints"
    assert checkpoints.latest(saved) == saved / "step-3.pt"
    assert [info.is_best for info in first.checkpoints] == [False]
    second = RecordingSink()
    fit(spec, data, RunOptions(out_dir=tmp_path / "split"), second)
    assert ("info", "resumed from step-3.pt at step 3") in second.events

    a = checkpoints.load(tmp_path / "whole" / "checkpoints" / "step-8.pt")["model"]
    b = checkpoints.load(saved / "step-8.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # A stopped run is not evaluated at its stop: the two runs' history is the whole one's.
    assert _history(first) + _history(second) == _history(whole)
