"""`resnet-service study run --search` here (--local: every trial in this process, each
sampled once the last ended) and on a real HTTP server, and `study extend`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from sqlalchemy import select
from typer.testing import CliRunner

from cli.main import app
from core.db.session import get_engine, session_scope
from core.db.tables import Job, Study
from core.settings import Settings
from tests.helpers import make_key

runner = CliRunner()
BASE = {
    "model": {"name": "resnet8"},
    "dataset": {"name": "synthetic", "image_size": 8, "train_size": 64, "test_size": 32},
    "recipe": {"batch_size": 16, "iterations": 8, "eval_every": 4},
}


def _base(folder: Path) -> Path:
    path = folder / "base.json"
    path.write_text(json.dumps(BASE))
    return path


def test_a_local_search_runs_its_trials_one_after_another(tmp_path: Path) -> None:
    out = tmp_path / "search"
    args = ["study", "run", "--base", str(_base(tmp_path)), "--search", "random"]
    args += [
        "--space",
        "recipe.lr=loguniform:0.01:0.2",
        "--space",
        "model.name=choice:resnet8,plain8",
    ]
    args += ["--trials", "3", "--pruner", "median", "--local", "--out", str(out)]
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    url = f"sqlite:///{out / 'study.db'}"
    with session_scope(url) as session:
        study = session.scalars(select(Study)).one()
        found = list(session.scalars(select(Job).order_by(Job.cell)))
    get_engine(url).dispose()
    assert study.spec["search"]["pruner"] == "median"
    header = (out / "results.md").read_text().splitlines()[2]  # the title, a blank, the table
    assert header.startswith("| recipe.lr | model.name | seeds |"), header
    assert [job.cell for job in found] == [0, 1, 2]
    assert {job.status for job in found} <= {"succeeded", "pruned"}
    for job, cell in zip(found, study.cells, strict=True):
        assert 0.01 <= job.spec["recipe"]["lr"] <= 0.2
        assert job.spec["model"]["name"] == cell["values"]["model.name"]


def test_a_bad_space_or_a_search_option_without_a_search_is_refused(tmp_path: Path) -> None:
    base = ["study", "run", "--base", str(_base(tmp_path))]
    cases = [
        (
            ["--search", "tpe", "--space", "recipe.lr=gauss:1:2", "--trials", "2"],
            "expected loguniform",
        ),
        (
            ["--search", "tpe", "--space", "recipe.lr=loguniform:a:b", "--trials", "2"],
            "bounds must be numbers",
        ),
        (["--search", "tpe", "--trials", "2"], "needs --space and --trials"),
        (["--trials", "2"], "need --search random or tpe"),
    ]
    for extra, words in cases:
        answer = runner.invoke(app, [*base, *extra, "--local", "--out", str(tmp_path / "x")])
        assert answer.exit_code == 2, answer.output
        assert words in " ".join(answer.output.replace("│", " ").split()), answer.output


def test_a_search_is_submitted_and_a_grid_extended_on_the_service(
    live_url: str, settings: Settings, tmp_path: Path
) -> None:
    key = make_key(settings.database_url, "read", "train")
    service = ["--url", live_url, "--key", key]
    args = ["study", "run", "--base", str(_base(tmp_path)), "--search", "tpe", "--trials", "4"]
    args += ["--space", "recipe.lr=loguniform:0.01:0.2", "--max-parallel", "1", *service]
    submitted = runner.invoke(app, args)
    assert submitted.exit_code == 0, submitted.output
    study_id, said = submitted.stdout.splitlines()[:2]
    assert said == "4 trials, 1 started"
    more = runner.invoke(app, ["study", "extend", study_id, "--trials", "2", *service])
    assert more.exit_code == 0, more.output
    with session_scope(settings.database_url) as session:
        study = session.get(Study, uuid.UUID(study_id))
        assert study is not None
        assert study.spec["search"]["trials"] == 6
    grid = ["study", "run", "--base", str(_base(tmp_path)), "--grid", "model.name=resnet8,plain8"]
    made = runner.invoke(app, [*grid, "--seeds", "2", *service])
    grid_id = made.stdout.splitlines()[0]
    added = runner.invoke(app, ["study", "extend", grid_id, "--cell-seeds", "1=3", *service])
    assert added.exit_code == 0, added.output
    assert added.stdout.startswith(f"{grid_id}: 7 jobs")
    neither = runner.invoke(app, ["study", "extend", grid_id, *service])
    assert neither.exit_code == 2
