"""`resnet-service study`: the presets, a whole study run here on digits (--local), and a
study submitted to, watched on and shown by a real HTTP server."""

from __future__ import annotations

import csv
import json
import struct
import threading
import uuid
from pathlib import Path

import pytest
import redis
from sqlalchemy import select
from typer.testing import CliRunner, Result

from cli.main import app
from core.db.session import session_scope
from core.db.tables import Job, Study
from core.queue import QUEUE
from core.settings import Settings
from core.studies import presets
from tests.helpers import claim, finish, make_key, wait_for

runner = CliRunner()
GRID = ["--grid", "model.name=plain8,resnet8"]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A tiny digits spec: one epoch of batch 64, no augmentation, no validation split."""
    path = tmp_path / "base.json"
    spec = {
        "model": {"name": "resnet8"},
        "dataset": {"name": "digits", "validation": 0},
        "recipe": {"epochs": 1, "batch_size": 64, "augment": False, "log_every": 5},
    }
    path.write_text(json.dumps(spec))
    return path


def test_presets_lists_every_preset() -> None:
    table = runner.invoke(app, ["study", "presets"])
    assert table.exit_code == 0, table.output
    for preset in presets.PRESETS.values():
        row = next(line for line in table.stdout.splitlines() if f" {preset.name} " in line)
        assert preset.metric in row
    listed = runner.invoke(app, ["study", "presets", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [row["name"] for row in rows] == list(presets.PRESETS)
    assert rows[0]["source"] == presets.PRESETS[rows[0]["name"]].source
    assert set(rows[0]["recipe"]) == {"quick", "paper"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give a PRESET, or --base"),
        (["degradation", "--dataset", "digits", *GRID], "a preset makes its own grid"),
        (["degradation"], "a preset runs on a dataset"),
        (["--base", "{base}"], "--base needs at least one AXIS=V1,V2"),
        (["--base", "{base}", "--grid", "model.name"], "expected AXIS=V1,V2"),
        (["--base", "{base}", *GRID, "--grid", "model.name=resnet20"], "given twice"),
        (["--base", "{base}", *GRID, "--local"], "--local needs a folder"),
        (["--base", "{base}", *GRID, "--out", "x"], "only with --local"),
    ],
)
def test_run_refuses_an_incomplete_study(args: list[str], message: str, base: Path) -> None:
    result = runner.invoke(app, ["study", "run", *(a.format(base=base) for a in args)])
    assert result.exit_code == 2
    assert message in _said(result.output)


def test_run_local_names_an_unknown_preset(tmp_path: Path) -> None:
    args = ["study", "run", "resnet_zoo", "--dataset", "digits", "--local", "--out", tmp_path]
    result = runner.invoke(app, [str(arg) for arg in args])
    assert result.exit_code == 2
    assert "preset 'resnet_zoo' is unknown; presets are degradation" in result.stderr


@pytest.mark.slow
def test_run_local_writes_results_and_figure(tmp_path: Path, base: Path) -> None:
    out = tmp_path / "study"
    args = ["study", "run", "--local", "--base", str(base), *GRID, "--seeds", "2"]
    args += ["--out", str(out), "--device", "cpu", "--data-root", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "4 jobs, one at a time" in result.stdout

    lines = (out / "results.md").read_text().splitlines()
    rows = [_cells(line, "|") for line in lines if line.startswith(("| plain8 ", "| resnet8 "))]
    assert [row[:2] for row in rows] == [["plain8", "2/2"], ["resnet8", "2/2"]]
    with (out / "results.csv").open() as table:
        cells = list(csv.DictReader(table))
    assert [(cell["model.name"], cell["seeds"]) for cell in cells] == [
        ("plain8", "2"),
        ("resnet8", "2"),
    ]
    for cell in cells:
        assert 0 <= float(cell["final_test_error_min"]) <= float(cell["final_test_error_max"]) < 1

    figure = (out / "figure.png").read_bytes()
    assert figure[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", figure[16:24])  # the IHDR chunk
    assert (width, height) == (660, 540)
    assert len(figure) > 20_000  # curves and bands, not an empty frame
    assert not (out / "study.db-wal").exists()

    again = runner.invoke(app, args)
    assert again.exit_code == 2
    assert "already holds a study; give a new folder" in _said(again.output)


@pytest.fixture(scope="module")
def key(settings: Settings) -> str:
    return make_key(settings.database_url, "read", "train")


def test_run_submits_and_show_prints_the_table(
    live_url: str, key: str, base: Path, queue: redis.Redis
) -> None:
    args = ["study", "run", "--base", str(base), *GRID, "--seeds", "2", "--max-parallel", "1"]
    submitted = runner.invoke(app, [*args, "--tag", "cli", "--url", live_url, "--key", key])
    assert submitted.exit_code == 0, submitted.output
    study_id, count = submitted.stdout.splitlines()
    assert count == "4 jobs: 2 cells x 2 seeds"
    assert queue.llen(QUEUE) == 1  # one at a time: the other three are held

    shown = runner.invoke(app, ["study", "show", study_id, "--url", live_url, "--key", key])
    assert shown.exit_code == 0, shown.output
    assert f"{study_id[:8]}: queued, 0/4 jobs ended" in shown.stdout
    for name in ("plain8", "resnet8"):
        row = next(line for line in shown.stdout.splitlines() if f" {name} " in line)
        assert _cells(row, "│") == [name, "0/2", "-", "-", "-"]
    assert "paper" not in shown.stdout  # no cell has a paper number

    args = ["study", "show", study_id, "--markdown", "--url", live_url, "--key", key]
    markdown = runner.invoke(app, args)
    assert markdown.exit_code == 0, markdown.output
    assert "| plain8 | 0/2 | - | - | - | - | - |" in markdown.stdout


def test_run_reports_a_bad_cell(live_url: str, key: str, base: Path) -> None:
    args = ["study", "run", "--base", str(base), "--grid", "model.name=resnet8,resnet9"]
    result = runner.invoke(app, [*args, "--url", live_url, "--key", key])
    assert result.exit_code == 2
    assert "cell 1 (model.name='resnet9'): model:" in result.stderr
    args = ["study", "show", str(uuid.uuid4()), "--url", live_url, "--key", key]
    missing = runner.invoke(app, args)
    assert missing.exit_code == 1
    assert "does not exist" in missing.stderr


def _finish_study(url: str, name: str) -> None:
    """Play a worker: end each job of the study called `name` once it is released, cell c
    with a final test error of (c + 1) / 10."""

    def released() -> list[tuple[uuid.UUID, int]] | None:
        with session_scope(url) as session:
            study_id = session.scalar(select(Study.id).where(Study.name == name))
            query = select(Job.id, Job.cell).where(
                Job.study_id == study_id, Job.status == "queued", Job.held.is_(False)
            )
            return [(job_id, cell or 0) for job_id, cell in session.execute(query)] or None

    for job_id, cell in wait_for(released, 30, f"the jobs of study {name!r}"):
        token = claim(url, job_id)
        finish(url, job_id, token, final_test_error=(cell + 1) / 10, best_test_error=0.05)


def test_run_watch_follows_the_study_to_its_table(
    live_url: str, key: str, base: Path, settings: Settings
) -> None:
    args = ["study", "run", "--base", str(base), *GRID, "--name", "watched", "--watch"]
    args += ["--interval", "0.1", "--url", live_url, "--key", key]
    watched: list[Result] = []
    watch = threading.Thread(target=lambda: watched.append(runner.invoke(app, args)), daemon=True)
    watch.start()
    _finish_study(settings.database_url, "watched")
    watch.join(30)
    assert watched, "the watch did not end when the study did"
    result = watched[0]
    assert result.exit_code == 0, result.output
    assert ": succeeded, 2/2 jobs ended" in result.stdout
    row = next(line for line in result.stdout.splitlines() if " resnet8 " in line)
    assert _cells(row, "│")[1:5] == ["1/1", "-", "20.00", "5.00"]


def _cells(row: str, separator: str) -> list[str]:
    """The cells of a table row, stripped."""
    return [cell.strip() for cell in row.strip().strip(separator).split(separator)]


def _said(output: str) -> str:
    """What a command printed, its words joined by single spaces, without rich's frame."""
    return " ".join(output.replace("│", " ").split())
