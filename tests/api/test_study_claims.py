"""A study's claims, comparisons and seed plan over HTTP, on a cifar_depth study whose jobs'
rows are written by hand: ResNet-56 clearly below ResNet-44, ResNet-44 and ResNet-32
overlapping, ResNet-32 clearly below ResNet-20."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests.helpers import claim, finish

STUDIES = "/api/v1/studies"
ERRORS = {
    "resnet20": [0.30, 0.31, 0.32],
    "resnet32": [0.20, 0.21, 0.22],
    "resnet44": [0.18, 0.215, 0.19],
    "resnet56": [0.10, 0.11, 0.12],
}


@pytest.fixture(scope="module")
def study(client: TestClient, settings: Settings) -> dict[str, Any]:
    """A finished quick cifar_depth study of 3 seeds with the made-up errors above."""
    return _finished(client, settings)


def _finished(client: TestClient, settings: Settings) -> dict[str, Any]:
    body = {"preset": "cifar_depth", "dataset": {"name": "digits"}, "seeds": 3}
    made = client.post(STUDIES, json=body)
    assert made.status_code == 202, made.text
    url = settings.database_url
    with session_scope(url) as session:
        rows = session.execute(
            select(Job.id, Job.spec).where(Job.study_id == uuid.UUID(made.json()["id"]))
        ).all()
    for job_id, spec in rows:
        with session_scope(url) as session:
            session.get(Job, job_id).held = False  # type: ignore[union-attr]
        error = ERRORS[spec["model"]["name"]][spec["recipe"]["seed"]]
        finish(url, job_id, claim(url, job_id), final_test_error=error, best_test_error=error)
    answer = client.get(f"{STUDIES}/{made.json()['id']}")
    assert answer.json()["state"] == "succeeded"
    return dict(answer.json())


def test_the_study_judges_its_presets_claims_and_shows_intervals(
    client: TestClient, study: dict[str, Any]
) -> None:
    verdicts = {found["claim"]: found for found in study["claims"]}
    assert {name: found["verdict"] for name, found in verdicts.items()} == {
        "resnet56 < resnet44 in final test error": "reproduced",
        "resnet44 < resnet32 in final test error": "inconclusive",
        "resnet32 < resnet20 in final test error": "reproduced",
    }
    open_claim = verdicts["resnet44 < resnet32 in final test error"]
    assert open_claim["seeds_needed"] is not None
    assert open_claim["seeds_needed"] > 3
    assert open_claim["n"] == [3, 3]
    assert open_claim["test"] == "Welch's t-test"
    first = study["cells"][0]["final_test_error"]
    assert first["median_ci"][0] <= first["median"] <= first["median_ci"][1]
    assert first["mean_ci"][0] >= 0.30
    markdown = client.get(f"{STUDIES}/{study['id']}/results.md").text
    assert "| resnet56 < resnet44 in final test error | reproduced |" in markdown
    assert "Inconclusive:" in markdown
    header = client.get(f"{STUDIES}/{study['id']}/results.csv").text.splitlines()[0]
    assert header.startswith("model.name,seeds,failed,")
    assert header.endswith("best_test_error_mean_ci_low,best_test_error_mean_ci_high")


def test_compare_against_a_reference_and_two_cells(
    client: TestClient, study: dict[str, Any]
) -> None:
    against = client.get(f"{STUDIES}/{study['id']}/compare", params={"reference": 0})
    assert against.status_code == 200, against.text
    found = against.json()
    assert [(c["a"], c["b"]) for c in found["comparisons"]] == [(1, 0), (2, 0), (3, 0)]
    assert all(c["lower"] == c["a"] for c in found["comparisons"])  # all below ResNet-20
    two = client.get(
        f"{STUDIES}/{study['id']}/compare", params={"a": 2, "b": 1, "test": "mannwhitney"}
    ).json()
    assert two["test"] == "Mann-Whitney U test"
    assert two["comparisons"][0]["lower"] is None
    assert two["comparisons"][0]["p"] >= 0.1


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"reference": 9}, "cell 9 is unknown"),
        ({"a": 1}, "give a and b"),
        ({"metric": "accuracy"}, "metric 'accuracy' is not in the results"),
    ],
)
def test_bad_comparisons_are_422(
    client: TestClient, study: dict[str, Any], params: dict[str, Any], message: str
) -> None:
    response = client.get(f"{STUDIES}/{study['id']}/compare", params=params)
    assert response.status_code == 422
    assert message in response.json()["error"]["message"]


def test_the_plan_asks_seeds_for_the_open_claims_cells(
    client: TestClient, study: dict[str, Any]
) -> None:
    plan = client.get(f"{STUDIES}/{study['id']}/plan", params={"level": 0.05, "power": 0.8})
    assert plan.status_code == 200, plan.text
    body = plan.json()
    needed = next(c["seeds_needed"] for c in body["claims"] if c["verdict"] == "inconclusive")
    assert body["extend"] == {"add_seeds": {"1": needed - 3, "2": needed - 3}}
    stricter = client.get(f"{STUDIES}/{study['id']}/plan", params={"power": 0.95}).json()
    more = next(c["seeds_needed"] for c in stricter["claims"] if c["verdict"] == "inconclusive")
    assert more > needed


def test_the_plans_body_extends_the_study_with_those_seeds(
    client: TestClient, settings: Settings
) -> None:
    made = _finished(client, settings)
    plan = client.get(f"{STUDIES}/{made['id']}/plan").json()
    extended = client.post(f"{STUDIES}/{made['id']}/extend", json=plan["extend"])
    assert extended.status_code == 202, extended.text
    added = sum(plan["extend"]["add_seeds"].values())
    assert extended.json()["counts"]["total"] == made["counts"]["total"] + added
    assert extended.json()["state"] in ("queued", "running")
    by_cell = {cell["cell"]: cell["jobs"] for cell in extended.json()["cells"]}
    for cell, count in plan["extend"]["add_seeds"].items():
        assert by_cell[int(cell)] == 3 + count
