"""A search study's trials read from its jobs' rows: objective, cost, best trial, best so
far, and importances that find the parameter the objective depends on."""

from __future__ import annotations

import math
import random
import uuid

import pytest

from core.db.session import session_scope
from core.db.tables import Study
from core.errors import ConflictError
from core.studies import trials
from tests.searches import BASE, DECAY, LR, MADE, SEARCH, write_search


def read(url: str, study_id: uuid.UUID) -> tuple[Study, list[trials.Trial]]:
    """The study and its trials as `trials.rows` reads them."""
    with session_scope(url) as session:
        study = session.get(Study, study_id)
        assert study is not None
        return study, trials.rows(session, study)


@pytest.fixture(scope="module")
def search(database_url: str) -> tuple[Study, list[trials.Trial]]:
    return read(database_url, write_search(database_url, MADE))


def test_each_trial_has_its_jobs_last_and_best_objective_steps_and_seconds(
    search: tuple[Study, list[trials.Trial]],
) -> None:
    _, rows = search
    assert [(row.trial, row.cell) for row in rows] == [(n, n) for n in range(6)]
    first, pruned, _, failed, _, queued = rows
    assert (first.status, first.value, first.best_value) == ("succeeded", 0.32, 0.30)
    assert first.params == {LR: 0.1, DECAY: 0.0001}
    assert first.steps == 400
    assert first.job_seconds == pytest.approx(100, abs=1)
    assert first.pruned_at is None
    assert first.spec["recipe"]["lr"] == 0.1
    assert (pruned.status, pruned.value, pruned.pruned_at) == ("pruned", 0.7, 100)
    assert pruned.steps == 100
    assert failed.value == 0.1
    assert not failed.completed  # a failed trial's value is not a result
    assert (queued.status, queued.value, queued.job_seconds, queued.steps) == ("queued", None, 0, 0)


def test_the_best_trial_is_the_lowest_completed_objective(
    search: tuple[Study, list[trials.Trial]],
) -> None:
    _, rows = search
    top = trials.best(rows)
    assert top is not None
    assert (top.trial, top.value, top.params[LR]) == (2, 0.20, 0.05)
    assert top.spec["recipe"] == {"epochs": 4, "lr": 0.05, "seed": 0}  # its job's full spec
    highest = trials.best(rows, minimize=False)
    assert highest is not None
    assert highest.trial == 0  # pruned and failed trials never count
    assert trials.best([row for row in rows if row.status != "succeeded"]) is None


def test_best_so_far_runs_over_completed_trials_in_trial_order(
    search: tuple[Study, list[trials.Trial]],
) -> None:
    _, rows = search
    assert trials.best_so_far(list(reversed(rows))) == [
        {"trial": 0, "value": 0.32, "best": 0.32},
        {"trial": 2, "value": 0.20, "best": 0.20},
        {"trial": 4, "value": 0.25, "best": 0.20},
    ]


def test_job_seconds_add_up_by_status_with_what_pruning_saved(
    search: tuple[Study, list[trials.Trial]],
) -> None:
    _, rows = search
    spent = trials.seconds_by_status(rows)
    assert spent["by_status"]["succeeded"] == pytest.approx(270, abs=3)
    assert spent["by_status"]["pruned"] == pytest.approx(25, abs=1)
    assert spent["by_status"]["queued"] == 0
    assert spent["total"] == pytest.approx(305, abs=4)
    # 25 s for 100 of its 400 steps: the 300 it did not train would have taken 75 s.
    assert spent["saved_by_pruning"] == pytest.approx(75, abs=1)


def test_parallel_coordinates_draw_a_line_per_completed_and_pruned_trial(
    search: tuple[Study, list[trials.Trial]],
) -> None:
    study, rows = search
    drawn = trials.parallel(study, rows)
    assert [axis["path"] for axis in drawn["axes"]] == [LR, DECAY]
    assert drawn["axes"][0] | {"path": None} == {
        "path": None, "type": "loguniform", "low": 0.01, "high": 0.5, "log": True, "choices": None,
    }  # fmt: skip
    assert [(line["trial"], line["value"], line["status"]) for line in drawn["lines"]] == [
        (0, 0.32, "succeeded"),
        (1, 0.70, "pruned"),
        (2, 0.20, "succeeded"),
        (4, 0.25, "succeeded"),
    ]  # fmt: skip  (the pruned trial at its last evaluation; neither failed nor queued)


def test_the_csv_has_a_row_per_trial_with_each_parameter(
    search: tuple[Study, list[trials.Trial]],
) -> None:
    study, rows = search
    lines = trials.as_csv(study, rows).splitlines()
    assert lines[0] == (
        "trial,cell,job_id,status,recipe.lr,recipe.weight_decay,"
        "value,best_value,steps,job_seconds,pruned_at"
    )
    assert lines[2].split(",")[3:8] == ["pruned", "0.3", "0.0005", "0.7", "0.7"]
    assert lines[2].endswith(",100")
    queued = lines[6].split(",")
    assert (queued[3], queued[6]) == ("queued", "")  # no objective yet
    assert uuid.UUID(queued[2]) == rows[5].job_id


def test_the_parameter_the_objective_depends_on_is_the_important_one(database_url: str) -> None:
    draw = random.Random(7)
    made = []
    for _ in range(24):
        lr, decay = math.exp(draw.uniform(math.log(0.01), math.log(0.5))), draw.uniform(0, 1e-3)
        objective = 0.1 + 0.2 * abs(math.log(lr / 0.1))  # best at lr 0.1, whatever the decay
        made.append(
            {"values": {LR: lr, DECAY: decay}, "status": "succeeded", "points": {4: objective}}
        )
    made.append({"values": {LR: 0.1, DECAY: 0.0}, "status": "pruned", "points": {1: 0.01}})
    study, rows = read(database_url, write_search(database_url, made))
    found = trials.importances(study, rows)
    assert found is not None
    assert set(found) == {LR, DECAY}
    assert found[LR] > 0.8 > 0.2 > found[DECAY]
    assert sum(found.values()) == pytest.approx(1)
    assert trials.importances(study, rows) == found  # the evaluator is seeded


def test_importances_need_two_completed_trials_and_two_parameters(database_url: str) -> None:
    one = [
        {"values": {LR: 0.1, DECAY: 0.0}, "status": "succeeded", "points": {1: 0.2}},
        {"values": {LR: 0.2, DECAY: 0.0}, "status": "pruned", "points": {1: 0.3}},
    ]
    study, rows = read(database_url, write_search(database_url, one))
    assert trials.importances(study, rows) is None
    alone = {**SEARCH, "space": {LR: SEARCH["space"][LR]}}
    two = [{**one[0], "values": {LR: lr}} for lr in (0.1, 0.2)]
    study, rows = read(database_url, write_search(database_url, two, alone))
    assert trials.importances(study, rows) is None
    same = [{**one[0], "values": {LR: lr, DECAY: 0.0}} for lr in (0.1, 0.2, 0.3)]
    study, rows = read(database_url, write_search(database_url, same))
    assert trials.importances(study, rows) is None  # every objective 0.2: nothing to explain


def test_a_grid_study_has_no_trials(database_url: str) -> None:
    with session_scope(database_url) as session:
        grid = Study(
            spec={"base": BASE, "grid": {LR: [0.1]}, "seeds": [0]},
            cells=[{"values": {LR: 0.1}, "paper": None}],
            metric="final_test_error",
            max_parallel=1,
        )
        session.add(grid)
        session.flush()
        with pytest.raises(ConflictError, match=r"is a grid, not a search.*results"):
            trials.rows(session, grid)
