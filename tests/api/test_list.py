"""GET /jobs over 60 jobs: filters, the six sorts, and keyset pages without gaps or repeats."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from core import jobs
from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests.helpers import claim, finish, new_job

JOBS = "/api/v1/jobs"
MODELS = ("resnet20", "resnet56", "plain20")
STATUSES = ("queued", "running", "succeeded", "succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Row:
    """What the test knows about a seeded job, read back from the database."""

    id: uuid.UUID
    status: str
    model: str
    family: str
    dataset: str
    tags: list[str]
    name: str
    created_at: datetime
    finished_at: datetime | None
    best_test_error: float | None


def _seed_one(url: str, index: int) -> uuid.UUID:
    """Job `index`, driven to one of the statuses (errors repeat, so sorts meet ties)."""
    job_id = new_job(
        url,
        name=f"Run {index:02d}" + (" 100%_done" if index % 10 == 0 else ""),
        tags=["even"] if index % 2 == 0 else ["odd", "x"],
        model={"name": MODELS[index % 3]},
        dataset={"name": "synthetic" if index % 4 == 0 else "digits"},
    )
    status = STATUSES[index % len(STATUSES)]
    if status == "cancelled":
        with session_scope(url) as session:
            jobs.request_cancel(session=session, job_id=job_id)
    elif status != "queued":
        token = claim(url, job_id)
        if status == "succeeded":
            finish(url, job_id, token, best_test_error=round(0.05 * (index % 4), 2))
        elif status == "failed":
            with session_scope(url) as session:
                jobs.finish(session=session, job_id=job_id, token=token, status="failed")
    return job_id


@pytest.fixture(scope="module")
def seeded(settings: Settings) -> list[Row]:
    """60 jobs in every status, three models, two datasets, two tag sets."""
    ids = [_seed_one(settings.database_url, index) for index in range(60)]
    with session_scope(settings.database_url) as session:
        found = [session.get(Job, job_id) for job_id in ids]
        return [
            Row(
                job.id,
                job.status,
                job.model_name or "",
                job.model_family or "",
                job.dataset_name or "",
                job.tags,
                job.name or "",
                job.created_at,
                job.finished_at,
                job.best_test_error,
            )
            for job in found
            if job is not None
        ]


def _expected(rows: list[Row], sort: str) -> list[str]:
    """The order the API promises: by the key (nulls last), then id, both in one direction."""
    field = {"created": "created_at", "finished": "finished_at"}.get(
        sort.lstrip("-"), sort.lstrip("-")
    )
    descending = sort.startswith("-")
    present = [row for row in rows if getattr(row, field) is not None]
    missing = [row for row in rows if getattr(row, field) is None]
    present.sort(key=lambda row: (getattr(row, field), row.id), reverse=descending)
    missing.sort(key=lambda row: row.id, reverse=descending)
    return [str(row.id) for row in present + missing]


def _all_pages(client: TestClient, **params: object) -> tuple[list[str], int]:
    """Every id, following next_cursor; and the number of pages."""
    ids: list[str] = []
    pages, cursor = 0, None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = client.get(JOBS, params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        ids += [item["id"] for item in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            return ids, pages


@pytest.mark.parametrize(
    "sort", ["created", "-created", "finished", "-finished", "best_test_error", "-best_test_error"]
)
def test_pages_cover_every_job_once_in_order(
    client: TestClient, seeded: list[Row], sort: str
) -> None:
    ids, pages = _all_pages(client, sort=sort, limit=7)
    assert ids == _expected(seeded, sort)
    assert len(set(ids)) == 60
    assert pages == 9  # 8 full pages of 7 and one of 4


FILTERS: dict[str, tuple[dict[str, Any], Callable[[Row], bool]]] = {
    "succeeded": ({"status": "succeeded"}, lambda r: r.status == "succeeded"),
    "queued or running": (
        {"status": ["queued", "running"]},
        lambda r: r.status in ("queued", "running"),
    ),
    "model": ({"model": "resnet56"}, lambda r: r.model == "resnet56"),
    "family": ({"family": "plain"}, lambda r: r.family == "plain"),
    "dataset": ({"dataset": "synthetic"}, lambda r: r.dataset == "synthetic"),
    "tag": ({"tag": "x"}, lambda r: "x" in r.tags),
    "text, case and wildcards": ({"q": "0%_D"}, lambda r: "0%_d" in r.name.lower()),
    "combined": (
        {"status": "succeeded", "model": "resnet20", "sort": "best_test_error"},
        lambda r: r.status == "succeeded" and r.model == "resnet20",
    ),
}


@pytest.mark.parametrize("case", FILTERS.keys())
def test_filters_select_exactly_the_matching_jobs(
    client: TestClient, seeded: list[Row], case: str
) -> None:
    params, matches = FILTERS[case]
    ids, _ = _all_pages(client, limit=5, **params)
    sort = str(params.get("sort", "-created"))
    assert ids == _expected([row for row in seeded if matches(row)], sort)
    assert ids


def test_list_items_carry_progress_results_and_links(client: TestClient, seeded: list[Row]) -> None:
    page = client.get(JOBS, params={"status": "succeeded", "sort": "-best_test_error", "limit": 1})
    item = page.json()["items"][0]
    assert item["results"]["best_test_error"] == 0.15
    assert item["links"]["self"] == f"{JOBS}/{item['id']}"
    assert "spec" not in item
    assert client.get(item["links"]["self"]).json()["spec"]["model"]["name"] == item["model"]


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"cursor": "bm90LWEtY3Vyc29y"}, ["query", "cursor"]),
        ({"sort": "name"}, ["query", "sort"]),
        ({"limit": 0}, ["query", "limit"]),
        ({"limit": 201}, ["query", "limit"]),
        ({"status": "paused"}, ["query", "status", 0]),
        ({"colour": "red"}, ["query", "colour"]),
        ({"kind": "finetune"}, ["query", "kind"]),
    ],
)
def test_bad_list_parameters_are_422(
    client: TestClient, seeded: list[Row], params: dict[str, object], loc: list[object]
) -> None:
    response = client.get(JOBS, params=params)
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["loc"] == loc


def test_a_cursor_of_another_sort_is_refused(client: TestClient, seeded: list[Row]) -> None:
    cursor = client.get(JOBS, params={"sort": "created", "limit": 2}).json()["next_cursor"]
    response = client.get(JOBS, params={"sort": "-finished", "cursor": cursor})
    assert response.status_code == 422
    assert "sort=created" in response.json()["error"]["message"]


def test_the_job_kinds_are_listed_and_filter_the_jobs(
    client: TestClient, seeded: list[Row]
) -> None:
    kinds = client.get(f"{JOBS}/kinds").json()
    assert [kind["kind"] for kind in kinds] == ["train", "evaluate", "predict", "import"]
    assert all(kind["description"] for kind in kinds)
    ids, _ = _all_pages(client, kind="train", limit=50)
    assert len(ids) == len(seeded)
    assert _all_pages(client, kind="evaluate")[0] == []
