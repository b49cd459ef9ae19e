"""Checkpoints are atomic, verified and safe to load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from training import checkpoints
from training.checkpoints import CheckpointError


def _state(step: int) -> dict[str, object]:
    return {"model": {"w": torch.full((4,), float(step))}, "step": step, "epoch": step // 10}


def test_save_and_load_round_trip_with_sha256(tmp_path: Path) -> None:
    info = checkpoints.save(tmp_path, _state(10), is_best=True, keep_last=2)
    assert info.path == tmp_path / "step-10.pt"
    assert info.sha256 == checkpoints.sha256_of(info.path)
    assert info.bytes == info.path.stat().st_size
    loaded = checkpoints.load(info.path, sha256=info.sha256)
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 10.0))
    assert checkpoints.load(tmp_path / "best.pt")["step"] == 10


def test_keeps_the_last_k_and_the_best(tmp_path: Path) -> None:
    for step, best in ((10, True), (20, False), (30, False), (40, False)):
        checkpoints.save(tmp_path, _state(step), is_best=best, keep_last=2)
    names = sorted(p.name for p in tmp_path.glob("*.pt"))
    assert names == ["best.pt", "step-30.pt", "step-40.pt"]
    assert checkpoints.load(tmp_path / "best.pt")["step"] == 10
    assert checkpoints.latest(tmp_path) == tmp_path / "step-40.pt"


def test_an_interrupted_write_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoints.save(tmp_path, _state(10), is_best=True, keep_last=5)
    before = (tmp_path / "best.pt").read_bytes()

    def crash(*_args: object) -> None:
        raise OSError("disk pulled out mid-write")

    # The process dies after the temp file is written, before the rename.
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="mid-write"):
        checkpoints.save(tmp_path, _state(20), is_best=True, keep_last=5)
    assert (tmp_path / "best.pt").read_bytes() == before
    assert checkpoints.load(tmp_path / "best.pt")["step"] == 10
    assert checkpoints.latest(tmp_path) == tmp_path / "step-10.pt"


def test_a_corrupted_checkpoint_is_refused(tmp_path: Path) -> None:
    info = checkpoints.save(tmp_path, _state(10), is_best=False, keep_last=2)
    data = bytearray(info.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    info.path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted: its sha256 differs"):
        checkpoints.load(info.path)


def test_a_truncated_file_without_sha_is_a_clear_error(tmp_path: Path) -> None:
    info = checkpoints.save(tmp_path, _state(10), is_best=False, keep_last=2)
    info.path.with_suffix(".sha256").unlink()
    info.path.write_bytes(info.path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="cannot be read"):
        checkpoints.load(info.path)


def test_pickled_code_is_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": os.system}, path)
    with pytest.raises(CheckpointError, match="cannot be read"):
        checkpoints.load(path)


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoints.load(tmp_path / "nope.pt")
