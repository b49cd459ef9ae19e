"""A search study's trials over HTTP on Postgres: the trials and what they show as JSON, the
same rows as CSV, and a grid study's 409 pointing at its results."""

from __future__ import annotations

import csv
import io
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from client import Client, ConflictError
from core.settings import Settings
from tests.helpers import make_key
from tests.searches import DECAY, LR, MADE, write_search

STUDIES = "/api/v1/studies"
GRID: dict[str, Any] = {
    "base": {"model": {"name": "resnet8"}, "dataset": {"name": "digits"}},
    "grid": {"recipe.lr": [0.1, 0.05]},
}


@pytest.fixture(scope="module")
def search_id(settings: Settings) -> uuid.UUID:
    """A search of six trials: three succeeded, one pruned, one failed, one queued."""
    return write_search(settings.database_url, MADE)


def test_trials_answer_every_trial_the_best_and_the_compute(
    client: TestClient, search_id: uuid.UUID
) -> None:
    answer = client.get(f"{STUDIES}/{search_id}/trials")
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert (found["method"], found["objective"], found["direction"]) == (
        "tpe", "val/error", "minimize",
    )  # fmt: skip
    assert [t["status"] for t in found["trials"]] == [
        "succeeded", "pruned", "succeeded", "failed", "succeeded", "queued",
    ]  # fmt: skip
    pruned = found["trials"][1]
    assert (pruned["value"], pruned["pruned_at"], pruned["params"][LR]) == (0.7, 100, 0.3)
    best = found["best"]
    assert (best["trial"], best["value"], best["params"]) == (2, 0.2, {LR: 0.05, DECAY: 0.0002})
    assert best["spec"]["recipe"]["lr"] == 0.05
    assert best["job_id"] == found["trials"][2]["job_id"]
    assert [(p["trial"], p["best"]) for p in found["best_so_far"]] == [
        (0, 0.32),
        (2, 0.2),
        (4, 0.2),
    ]
    assert set(found["importances"]) == {LR, DECAY}
    assert sum(found["importances"].values()) == pytest.approx(1)
    assert [line["trial"] for line in found["parallel"]["lines"]] == [0, 1, 2, 4]
    seconds = found["job_seconds"]
    assert seconds["by_status"]["pruned"] == pytest.approx(25, abs=1)
    assert seconds["saved_by_pruning"] == pytest.approx(75, abs=1)
    assert seconds["total"] == pytest.approx(sum(seconds["by_status"].values()))


def test_the_trials_csv_is_one_row_per_trial(client: TestClient, search_id: uuid.UUID) -> None:
    answer = client.get(f"{STUDIES}/{search_id}/trials.csv")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/csv")
    assert f"study-{search_id}-trials.csv" in answer.headers["content-disposition"]
    table = list(csv.DictReader(io.StringIO(answer.text)))
    assert [row["trial"] for row in table] == ["0", "1", "2", "3", "4", "5"]
    assert (table[2][LR], table[2]["value"], table[2]["best_value"]) == ("0.05", "0.2", "0.2")
    assert (table[1]["status"], table[1]["pruned_at"]) == ("pruned", "100")
    assert table[5]["value"] == ""


def test_a_grid_study_has_no_trials_but_results(client: TestClient) -> None:
    study = client.post(STUDIES, json=GRID).json()
    for route in ("trials", "trials.csv"):
        answer = client.get(f"{STUDIES}/{study['id']}/{route}")
        assert answer.status_code == 409
        message = answer.json()["error"]["message"]
        assert "is a grid, not a search" in message
        assert f"/api/v1/studies/{study['id']}/results.csv" in message
    assert client.get(f"{STUDIES}/{uuid.uuid4()}/trials").status_code == 404


def test_the_client_reads_the_trials_and_their_csv(
    live_url: str, settings: Settings, search_id: uuid.UUID
) -> None:
    key = make_key(settings.database_url, "read", "train")
    with Client(live_url, key=key) as client:
        found = client.study_trials(search_id)
        assert found["best"] is not None
        assert found["best"]["trial"] == 2
        assert client.study_trials_csv(search_id).startswith("trial,cell,job_id,status,")
        grid = client.submit_study(base=GRID["base"], grid=GRID["grid"])
        with pytest.raises(ConflictError, match="not a search"):
            client.study_trials(grid["id"])


def test_a_submitted_search_has_its_trials_before_any_ended(client: TestClient) -> None:
    body = {
        **GRID,
        "grid": {},
        "search": "random",
        "space": {LR: {"type": "loguniform", "low": 0.01, "high": 0.5}},
        "trials": 3,
        "pruner": "median",
    }
    submitted = client.post(STUDIES, json=body)
    assert submitted.status_code == 202, submitted.text
    found = client.get(f"{STUDIES}/{submitted.json()['id']}/trials").json()
    assert (found["method"], found["objective"]) == ("random", "val/error")
    numbers = [trial["trial"] for trial in found["trials"]]  # trials are asked as jobs free up
    assert numbers == list(range(len(numbers)))
    assert 1 <= len(numbers) <= 3
    assert all(0.01 <= trial["params"][LR] <= 0.5 for trial in found["trials"])
    assert {trial["status"] for trial in found["trials"]} == {"queued"}
    assert (found["best"], found["importances"], found["best_so_far"]) == (None, None, [])
    assert found["job_seconds"]["total"] == 0
