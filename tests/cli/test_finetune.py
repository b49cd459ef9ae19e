"""`resnet-service train --init`: a local fine-tune from a checkpoint file, end to end."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
BASE = ["train", "--model", "resnet8", "--dataset", "digits", "--iterations", "4"]


def test_train_from_a_checkpoint_file_records_the_init(tmp_path: Path) -> None:
    common = ["--data-root", str(tmp_path), "--device", "cpu", "-r", "batch_size=64"]
    made = runner.invoke(app, [*BASE, *common, "--out", str(tmp_path / "base")])
    assert made.exit_code == 0, made.output
    best = tmp_path / "base" / "checkpoints" / "best.pt"
    args = [*BASE, *common, "--out", str(tmp_path / "tuned"), "--init", str(best)]
    tuned = runner.invoke(app, [*args, "-i", "freeze=stem,layer1", "-i", "backbone_lr=0.1"])
    assert tuned.exit_code == 0, tuned.output
    init = json.loads((tmp_path / "tuned" / "spec.json").read_text())["init"]
    assert (init["head"], init["freeze"], init["backbone_lr"]) == ("keep", ["stem", "layer1"], 0.1)
    assert init["resolved"]["step"] == 4
    assert init["resolved"]["path"] == str(best.resolve())


def test_init_options_without_init_are_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, [*BASE, "-i", "head=reset", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "needs --init to name the weights" in result.output
