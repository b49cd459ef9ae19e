"""`resnet-service study show` of a search study on a real HTTP server: the best trial, the
top trials, the importances and the job-seconds by status."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app
from core.settings import Settings
from tests.helpers import make_key
from tests.searches import DECAY, LR, MADE, write_search

runner = CliRunner()


def test_show_prints_a_search_best_trial_top_trials_importances_and_seconds(
    live_url: str, settings: Settings
) -> None:
    study_id = str(write_search(settings.database_url, MADE))
    key = make_key(settings.database_url, "read")
    shown = runner.invoke(app, ["study", "show", study_id, "--url", live_url, "--key", key])
    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    assert f"{study_id[:8]}: running, 5/6 trials ended; tpe search, pruner median" in out
    assert f"best trial 2: val/error 0.2 ({LR}=0.05, {DECAY}=0.0002)" in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    top = [line.split("│")[1].strip() for line in rows if "400" in line]
    assert top == ["2", "4", "0"]  # the completed trials, best first
    assert "parameter importances (fANOVA)" in out
    assert LR in out.split("parameter importances")[1]
    seconds = next(line for line in out.splitlines() if line.startswith("job-seconds:"))
    assert "pruned 25" in seconds
    assert "pruning saved about 75" in seconds
