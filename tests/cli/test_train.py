"""`resnet-service train` and `evaluate` on real digits, end to end."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_train_then_evaluate(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "--model", "resnet8", "--dataset", "digits", "--epochs", "2"]
    args += ["-r", "batch_size=64", "-r", "augment=false", "--out", str(out)]
    args += ["--data-root", str(tmp_path), "--device", "cpu"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "final test error" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == summary["total_steps"] == 2 * (1294 // 64)
    assert (out / "metrics.jsonl").read_text().count("train/loss") >= 1

    last = out / "checkpoints" / f"step-{summary['steps']}.pt"
    args = ["evaluate", str(last), "--json", "--dataset", "digits"]
    evaluated = runner.invoke(app, [*args, "--data-root", str(tmp_path), "--device", "cpu"])
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.output)
    assert report["count"] == 359  # a stratified fifth of 1,797
    assert report["classes"] == [str(i) for i in range(10)]
    # The last checkpoint on the same split: the engine's own final number.
    assert abs(report["error"] - summary["final_test_error"]) < 1e-9


def test_train_rejects_a_bad_spec_with_the_field(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["train", "--model", "resnet21", "-r", "lr=-1", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "model: Value error, model 'resnet21'" in result.output
    assert "recipe.lr: Input should be greater than 0" in result.output
