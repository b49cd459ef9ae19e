"""The GPU script of the photo path runs end to end on its CPU path."""

from __future__ import annotations

import pytest

from bench import gpu_photos


def test_the_gpu_script_runs_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    gpu_photos.main(["--device", "cpu", "--quick"])
    printed = capsys.readouterr().out
    assert "file pipeline" in printed
    assert '"checked_against": "torchvision"' in printed  # the import compared the nets
    assert "4 steps of batch 8" in printed
    assert "augmentation random_resized_crop" in printed
