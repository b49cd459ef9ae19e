"""A search study and a study's extension over HTTP on Postgres and Redis: a space sampled
within its budget and max_parallel, bad searches refused with nothing written, seeds or
trials added in one request."""

from __future__ import annotations

import uuid
from typing import Any

import redis
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from core.db.session import session_scope
from core.db.tables import Job, Study
from core.settings import Settings
from core.studies import service
from tests.helpers import claim, finish, queued_ids

STUDIES = "/api/v1/studies"
BASE = {
    "model": {"name": "resnet8"},
    "dataset": {"name": "digits"},
    "recipe": {"epochs": 1, "batch_size": 64, "augment": False},
}
SPACE = {
    "recipe.lr": {"type": "loguniform", "low": 0.01, "high": 0.5},
    "recipe.weight_decay": {"type": "loguniform", "low": 1e-5, "high": 1e-3},
}


def _search(client: TestClient, **extra: Any) -> dict[str, Any]:
    body = {"base": BASE, "search": "tpe", "space": SPACE, "trials": 5, "max_parallel": 2}
    response = client.post(STUDIES, json={**body, **extra})
    assert response.status_code == 202, response.text
    return dict(response.json())


def _jobs(url: str, study_id: str) -> list[Job]:
    with session_scope(url) as session:
        query = select(Job).where(Job.study_id == uuid.UUID(study_id)).order_by(Job.cell)
        return list(session.scalars(query))


def test_a_search_starts_max_parallel_trials_and_asks_the_next_as_one_ends(
    client: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    study = _search(client, pruner="asha", name="lr x wd")
    assert study["state"] == "queued"
    assert study["spec"]["search"]["method"] == "tpe"
    assert study["spec"]["search"]["pruner"] == "asha"
    first = _jobs(settings.database_url, study["id"])
    assert len(first) == 2
    assert sorted(queued_ids(queue)) == sorted(str(job.id) for job in first)
    assert [job.cell for job in first] == [0, 1]
    url = settings.database_url
    finish(url, first[0].id, claim(url, first[0].id))
    with session_scope(url) as session:  # what the worker does once a job ends
        service.release_after(session=session, settings=settings, job_id=first[0].id)
    assert len(_jobs(url, study["id"])) == 3
    read = client.get(f"{STUDIES}/{study['id']}").json()
    assert read["state"] == "running"
    assert read["counts"]["pruned"] == 0


def test_a_bad_search_is_a_422_naming_its_field_and_writes_nothing(
    client: TestClient, settings: Settings
) -> None:
    before = _count(settings.database_url)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"space": {"recipe.lr": {"type": "uniform", "low": 1, "high": 1e9}}}, "recipe.lr"),
        ({"space": {"recipe.lr": {"type": "gauss"}}}, "needs a type"),
        ({"objective": "accuracy"}, "objective 'accuracy' is none of the metrics"),
        ({"seeds": 2}, "a search runs each trial on one seed"),
        ({"trials": None}, "needs a space and a number of trials"),
        ({"grid": {"recipe.lr": [0.1]}}, "takes no grid"),
        ({"search": "grid"}, "space, trials and pruner belong to a search"),
        ({"trials": 5000}, "over the limit"),
    ]
    body: dict[str, Any] = {"base": BASE, "search": "random", "space": SPACE, "trials": 5}
    for change, words in cases:
        answer = client.post(STUDIES, json={**body, **change})
        assert answer.status_code == 422, (change, answer.text)
        assert words in answer.text, (change, answer.text)
    assert _count(settings.database_url) == before


def test_a_dry_run_checks_a_search_and_counts_its_trials(client: TestClient) -> None:
    body = {"base": BASE, "search": "random", "space": SPACE, "trials": 7}
    answer = client.post(STUDIES, params={"dry_run": "true"}, json=body)
    assert answer.status_code == 200, answer.text
    assert (answer.json()["jobs"], answer.json()["cells"]) == (7, [])


def test_seeds_are_added_to_chosen_cells_as_their_smallest_unused_seeds(
    client: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    grid = {"model.name": ["plain8", "resnet8"]}
    response = client.post(
        STUDIES, json={"base": BASE, "grid": grid, "seeds": 2, "max_parallel": 1}
    )
    study = response.json()
    answer = client.post(f"{STUDIES}/{study['id']}/extend", json={"add_seeds": {"1": 3}})
    assert answer.status_code == 202, answer.text
    assert answer.json()["counts"]["total"] == 7
    seeds: dict[int, list[int]] = {0: [], 1: []}
    for job in _jobs(settings.database_url, study["id"]):
        seeds[job.cell or 0].append(job.spec["recipe"]["seed"])
    assert (sorted(seeds[0]), sorted(seeds[1])) == ([0, 1], [0, 1, 2, 3, 4])
    everywhere = client.post(f"{STUDIES}/{study['id']}/extend", json={"add_seeds": 1})
    assert everywhere.json()["counts"]["total"] == 9
    extensions = client.get(f"{STUDIES}/{study['id']}").json()["spec"]["extensions"]
    assert [e.get("add_seeds") for e in extensions] == [{"1": 3}, {"0": 1, "1": 1}]
    for body, status, words in [
        ({"add_seeds": {"5": 1}}, 422, "the study has no cell 5: its cells are 0 to 1"),
        ({"add_seeds": {"a": 1}}, 422, "keys are cell indexes"),
        ({"add_trials": 2}, 422, "add_trials extends a search"),
        ({}, 422, "give add_seeds or add_trials"),
    ]:
        answer = client.post(f"{STUDIES}/{study['id']}/extend", json=body)
        assert (answer.status_code, words in answer.text) == (status, True), answer.text
    client.post(f"{STUDIES}/{study['id']}/cancel")
    cancelled = client.post(f"{STUDIES}/{study['id']}/extend", json={"add_seeds": 1})
    assert cancelled.status_code == 409


def test_trials_are_added_to_a_search_and_asked_for_at_once_if_there_is_room(
    client: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    study = _search(client, trials=1, max_parallel=2)
    assert len(study["jobs"]) == 1
    answer = client.post(f"{STUDIES}/{study['id']}/extend", json={"add_trials": 3})
    assert answer.status_code == 202, answer.text
    assert answer.json()["spec"]["search"]["trials"] == 4
    assert len(_jobs(settings.database_url, study["id"])) == 2  # max_parallel
    seeds = client.post(f"{STUDIES}/{study['id']}/extend", json={"add_seeds": 2})
    assert seeds.status_code == 422
    assert "give add_trials" in seeds.text


def _count(url: str) -> int:
    with session_scope(url) as session:
        return session.scalar(select(func.count()).select_from(Study)) or 0
