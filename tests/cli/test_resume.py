"""`resnet-service train` on a run folder whose newest checkpoint is torn resumes from the one
before, on the same step axis, as a worker does."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from training import checkpoints

runner = CliRunner()


def _train(out: Path, tmp_path: Path, iterations: int) -> str:
    args = ["train", "--model", "resnet8", "--dataset", "synthetic", "--iterations"]
    args += [str(iterations), "-d", "image_size=8", "-d", "train_size=64", "-d", "test_size=16"]
    args += ["-r", "batch_size=16", "-r", "checkpoint_every=2", "-r", "log_every=1"]
    args += ["-r", "keep_last=3", "--out", str(out), "--data-root", str(tmp_path)]
    result = runner.invoke(app, [*args, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_torn_latest_checkpoint_falls_back_to_the_one_before(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _train(out, tmp_path, iterations=6)
    saved = out / "checkpoints"
    torn = saved / "step-6.pt"
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])  # a crash mid-write

    output = _train(out, tmp_path, iterations=8)
    assert "step-6.pt does not match its recorded sha256" in output
    events = (out / "events.log").read_text()
    assert "set aside as step-6.pt.corrupt" in events
    assert "resumed from step-4.pt at step 4" in events
    assert (saved / "step-6.pt.corrupt").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == summary["total_steps"] == 8
    assert checkpoints.load(saved / "step-8.pt")["step"] == 8
    # Steps 5 and 6 were trained again from step 4: the log continues from 5.
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_steps = sorted({s for s in steps})
    assert train_steps == list(range(1, 9))
    assert steps[steps.index(6) + 1 :].count(5) >= 1  # the second run's first step is 5
