"""A full disk: a checkpoint write is refused before it starts, a write that still runs out
of space leaves nothing behind, and the last good checkpoint verifies either way.

The disk is a real tmpfs of 1 MiB mounted for the test (these machines run the tests as
root); if it cannot be mounted, the tests fail.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from training import checkpoints
from training.checkpoints import DiskFullError

DISK_BYTES = 1024 * 1024


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"cannot mount a tmpfs (run the tests as root): {done.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _state(step: int) -> dict[str, Any]:
    """A checkpoint of about 160 KB."""
    torch.manual_seed(step)
    return {"model": {"w": torch.randn(40_000)}, "step": step, "epoch": step}


def _fill(disk: Path, leave: int) -> None:
    """Write a file that leaves about `leave` bytes free on `disk`."""
    free = shutil.disk_usage(disk).free
    (disk / "filler").write_bytes(bytes(max(0, free - leave)))


def _names(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_a_checkpoint_is_refused_before_writing_when_the_disk_lacks_room(disk: Path) -> None:
    folder = disk / "checkpoints"
    good = checkpoints.save(folder, _state(10), is_best=True, keep_last=2, free_margin=0)
    before = _names(folder)
    _fill(disk, leave=300_000)  # room for one copy, not for a step file and best.pt
    with pytest.raises(DiskFullError, match=r"checkpoint step-20\.pt: it needs") as refused:
        checkpoints.save(folder, _state(20), is_best=True, keep_last=2, free_margin=0)
    assert "CHECKPOINT_FREE_MARGIN_BYTES" in str(refused.value)
    assert _names(folder) == before
    assert checkpoints.load(folder / checkpoints.BEST, sha256=good.sha256)["step"] == 10
    assert checkpoints.latest(folder) == folder / "step-10.pt"


def test_the_margin_is_kept_free(disk: Path) -> None:
    folder = disk / "checkpoints"
    free = shutil.disk_usage(disk).free
    with pytest.raises(DiskFullError, match=f"a margin of {free:,}"):
        checkpoints.save(folder, _state(10), is_best=False, keep_last=2, free_margin=free)
    assert _names(folder) == []


def test_running_out_of_space_mid_write_leaves_the_last_good_checkpoint(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = disk / "checkpoints"
    good = checkpoints.save(folder, _state(10), is_best=True, keep_last=2, free_margin=0)
    before = _names(folder)
    _fill(disk, leave=250_000)
    # Another process takes the space between the check and the write: the check passes.
    plenty = SimpleNamespace(total=DISK_BYTES, used=0, free=10 * DISK_BYTES)
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: plenty)
    with pytest.raises(OSError, match="No space left") as failed:
        checkpoints.save(folder, _state(20), is_best=True, keep_last=2, free_margin=0)
    assert failed.value.errno == errno.ENOSPC
    assert _names(folder) == before  # no temporary file left, best.pt untouched
    assert checkpoints.load(folder / checkpoints.BEST, sha256=good.sha256)["step"] == 10
    assert checkpoints.load(folder / "step-10.pt", sha256=good.sha256)["step"] == 10
