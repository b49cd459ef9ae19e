"""GET /jobs with filter expressions and JSON-path sorts over 12 jobs; the CSV export; PATCH
of a job's tags and note; the same filters on SQLite."""

from __future__ import annotations

import csv
import io
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from client.filters import JobFilter
from core import job_queries, jobs
from core.db.session import session_scope
from core.settings import Settings
from tests.helpers import claim, make_key, new_job

JOBS = "/api/v1/jobs"
LRS = (0.1, 0.01, 0.2, 0.05)
UNITS = ("full_preact", "original", None)


@dataclass(frozen=True)
class Seeded:
    """What a test knows of a seeded job: its spec facts and its summary."""

    id: uuid.UUID
    unit: str | None
    lr: float
    dataset: str
    augment: bool
    tags: list[str]
    summary: dict[str, Any] | None

    def metric(self, key: str) -> Any:
        """A summary value (None when the job has no summary or not this key)."""
        return (self.summary or {}).get(key)


def _seed_one(url: str, index: int) -> Seeded:
    """Job `index`: one of three units, four lrs, two datasets; three in four succeeded."""
    unit = UNITS[index % 3]
    tags = ["a"] + (["b"] if index % 3 == 0 else []) if index % 2 else ["b"]
    job_id = new_job(
        url,
        name=f"run-{index:02d}",
        tags=tags,
        model={"name": "resnet8", "options": {"unit": unit} if unit else {}},
        dataset={"name": "synthetic" if index % 2 else "digits"},
        recipe={"lr": LRS[index % 4], "augment": index % 5 != 0},
    )
    summary = None
    if index % 4 != 3:
        train_error: float | str = 0.01 * (index % 6)
        if index == 4:  # a value of another type: never matches a number, never fails
            train_error = "n/a"
        summary = {"best_test_error": 0.04 + 0.02 * (index % 5), "best_train_error": train_error}
        token = claim(url, job_id)
        with session_scope(url) as session:
            jobs.finish(
                session=session, job_id=job_id, token=token, status="succeeded", summary=summary
            )
    dataset = "synthetic" if index % 2 else "digits"
    return Seeded(job_id, unit, LRS[index % 4], dataset, index % 5 != 0, tags, summary)


@pytest.fixture(scope="module")
def seeded(settings: Settings) -> list[Seeded]:
    """12 jobs of varied specs and summaries."""
    return [_seed_one(settings.database_url, index) for index in range(12)]


def _all_pages(client: TestClient, **params: Any) -> list[str]:
    """Every id, following next_cursor."""
    ids: list[str] = []
    cursor = None
    while True:
        response = client.get(JOBS, params={**params, **({"cursor": cursor} if cursor else {})})
        assert response.status_code == 200, response.text
        ids += [item["id"] for item in response.json()["items"]]
        cursor = response.json()["next_cursor"]
        if cursor is None:
            return ids


def _number(value: Any) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool)


CASES: dict[str, Callable[[Seeded], bool]] = {
    "model.options.unit=full_preact": lambda s: s.unit == "full_preact",
    "model.options.unit != full_preact": lambda s: s.unit != "full_preact",
    "recipe.lr=0.1": lambda s: s.lr == 0.1,
    "recipe.lr=1e-1": lambda s: s.lr == 0.1,
    'recipe.lr="0.1"': lambda s: False,  # a string never equals a number
    "recipe.lr<0.1": lambda s: s.lr < 0.1,
    "recipe.lr<=0.1": lambda s: s.lr <= 0.1,
    "recipe.lr>0.05": lambda s: s.lr > 0.05,
    "recipe.lr>=0.2": lambda s: s.lr >= 0.2,
    "spec.recipe.lr!=0.1": lambda s: s.lr != 0.1,
    "dataset.name=digits": lambda s: s.dataset == "digits",
    "dataset.name~SYNTH": lambda s: "synth" in s.dataset,
    "dataset.name>e": lambda s: s.dataset > "e",
    "recipe.augment=false": lambda s: not s.augment,
    "recipe.augment!=true": lambda s: not s.augment,
    "model.options.unit=null": lambda s: s.unit is None,
    "model.options.unit!=null": lambda s: s.unit is not None,
    "best_test_error<0.08": lambda s: (
        s.metric("best_test_error") is not None and s.metric("best_test_error") < 0.08
    ),
    "best_test_error=null": lambda s: s.summary is None,
    "summary.best_train_error<0.03": lambda s: (
        _number(s.metric("best_train_error")) and s.metric("best_train_error") < 0.03
    ),
    "summary.best_train_error>=0": lambda s: _number(s.metric("best_train_error")),
    'summary.best_train_error="n/a"': lambda s: s.metric("best_train_error") == "n/a",
    "summary.missing_key>1": lambda s: False,
}


@pytest.mark.parametrize("expression", CASES.keys())
def test_each_operator_selects_exactly_the_matching_jobs(
    client: TestClient, seeded: list[Seeded], expression: str
) -> None:
    ids = _all_pages(client, filter=expression, sort="created", limit=10)
    assert ids == [str(s.id) for s in seeded if CASES[expression](s)]


def test_filters_combine_with_each_other_and_every_tag(
    client: TestClient, seeded: list[Seeded]
) -> None:
    params = {"filter": ["recipe.lr<=0.05", "dataset.name=synthetic"], "tag": ["a", "b"]}
    ids = _all_pages(client, sort="created", **params)
    expected = [
        s for s in seeded if s.lr <= 0.05 and s.dataset == "synthetic" and {"a", "b"} <= {*s.tags}
    ]
    assert ids == [str(s.id) for s in expected]
    assert ids


def _in_order(seeded: list[Seeded], sort: str) -> list[str]:
    """The ids in the order of a sort by lr or a summary key: nulls last, ties by id."""
    key = sort.lstrip("-").removeprefix("summary.")

    def value(s: Seeded) -> Any:
        found = s.lr if key == "recipe.lr" else s.metric(key)
        return found if _number(found) else None

    descending = sort.startswith("-")
    present = [s for s in seeded if value(s) is not None]
    present.sort(key=lambda s: (value(s), s.id), reverse=descending)
    missing = sorted(
        (s for s in seeded if value(s) is None), key=lambda s: s.id, reverse=descending
    )
    return [str(s.id) for s in present + missing]


@pytest.mark.parametrize(
    "sort", ["summary.best_train_error", "-summary.best_train_error", "-recipe.lr"]
)
def test_json_path_sorts_page_in_order_nulls_last(
    client: TestClient, seeded: list[Seeded], sort: str
) -> None:
    assert _all_pages(client, sort=sort, limit=5) == _in_order(seeded, sort)


@pytest.mark.parametrize(
    ("params", "loc", "says"),
    [
        ({"filter": "recipe.lr<<0.1"}, ["query", "filter"], "starts with an operator"),
        ({"filter": "lr"}, ["query", "filter"], "`path op value`"),
        ({"filter": "Recipe.lr=1"}, ["query", "filter"], "dotted lowercase names"),
        ({"filter": "best_test_error<low"}, ["query", "filter"], "is a number"),
        ({"filter": "created_at>soon"}, ["query", "filter"], "ISO"),
        ({"filter": "recipe.lr<null"}, ["query", "filter"], "compares numbers"),
        ({"filter": "a.b.c.d.e.f.g.h.i=1"}, ["query", "filter"], "at most 8"),
        ({"filter": "recipe.lr=1e999"}, ["query", "filter"], "out of range"),
        ({"sort": "name"}, ["query", "sort"], "summary.<key>"),
        ({"sort": "-summary.Loss"}, ["query", "sort"], "dotted lowercase"),
    ],
)
def test_bad_expressions_are_422_naming_the_filter(
    client: TestClient, params: dict[str, str], loc: list[str], says: str
) -> None:
    response = client.get(JOBS, params=params)
    assert response.status_code == 422
    detail = response.json()["error"]["details"][0]
    assert detail["loc"] == loc
    assert says in detail["msg"]
    assert next(iter(params.values())) in detail["msg"]


def test_csv_holds_the_same_rows_as_the_list(client: TestClient, seeded: list[Seeded]) -> None:
    params = {"filter": "recipe.lr>=0.1", "sort": "-best_test_error"}
    listed = _all_pages(client, limit=200, **params)
    response = client.get(
        f"{JOBS}.csv", params={**params, "columns": "recipe.lr,summary.best_train_error"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    assert "attachment" in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [row["id"] for row in rows] == listed
    by_id = {str(s.id): s for s in seeded}
    for row in rows:
        job = by_id[row["id"]]
        assert float(row["recipe.lr"]) == job.lr
        assert row["tags"] == ";".join(job.tags)
        assert row["best_test_error"] == _cell(job.metric("best_test_error"))
        assert row["summary.best_train_error"] == _cell(job.metric("best_train_error"))


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def test_patch_edits_tags_and_note_of_ones_own_job(
    client: TestClient, admin: TestClient, settings: Settings
) -> None:
    spec = {"kind": "train", "model": {"name": "resnet8"}, "dataset": {"name": "digits"}}
    job_id = client.post(JOBS, json=spec).json()["id"]
    response = client.patch(
        f"{JOBS}/{job_id}", json={"tags": ["keep", "fig6"], "note": "lr too high"}
    )
    assert response.status_code == 200, response.text
    assert (response.json()["tags"], response.json()["note"]) == (["keep", "fig6"], "lr too high")
    assert client.patch(f"{JOBS}/{job_id}", json={"note": None}).json()["tags"] == ["keep", "fig6"]
    assert client.get(f"{JOBS}/{job_id}").json()["note"] is None
    client.patch(f"{JOBS}/{job_id}", json={"note": "again"})
    mine = client.get(JOBS, params={"owner": "me", "filter": "dataset.name=digits"}).json()
    assert [(item["id"], item["note"]) for item in mine["items"]] == [(job_id, "again")]
    other = TestClient(client.app, headers={"Authorization": f"Bearer {_train_key(settings)}"})
    assert other.patch(f"{JOBS}/{job_id}", json={"note": "mine now"}).status_code == 403
    assert admin.patch(f"{JOBS}/{job_id}", json={"tags": []}).json()["tags"] == []


def _train_key(settings: Settings) -> str:
    return make_key(settings.database_url, "read", "train")


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"tags": ["x" * 201]}, ["body", "tags", 0]),
        ({"tags": ["t"] * 21}, ["body", "tags"]),
        ({"note": "x" * 10_001}, ["body", "note"]),
        ({"colour": "red"}, ["body", "colour"]),
        ({}, ["body"]),
    ],
)
def test_bad_edits_are_422(
    admin: TestClient, seeded: list[Seeded], body: dict[str, Any], loc: list[object]
) -> None:
    response = admin.patch(f"{JOBS}/{seeded[0].id}", json=body)
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["loc"] == loc


def test_editing_an_unknown_job_is_404(admin: TestClient) -> None:
    assert admin.patch(f"{JOBS}/{uuid.uuid4()}", json={"note": "x"}).status_code == 404


def _every(_: Seeded) -> bool:
    return True


def test_the_filters_work_on_sqlite(sqlite_url: str) -> None:
    made = [_seed_one(sqlite_url, index) for index in range(8)]
    cases = [*CASES, "created_at>=2000-01-01"]
    with session_scope(sqlite_url) as session:
        for expression in cases:
            filters = JobFilter(filter=[expression], sort="created")
            found, _ = job_queries.list_jobs(session=session, filters=filters, limit=100)
            matches = CASES.get(expression, _every)
            assert [job.id for job in found] == [s.id for s in made if matches(s)], expression
        sort, ids, cursor = "-summary.best_train_error", [], None
        while True:
            page, cursor = job_queries.list_jobs(
                session=session, filters=JobFilter(sort=sort), limit=5, cursor=cursor
            )
            ids += [str(job.id) for job in page]
            if cursor is None:
                break
    assert ids == _in_order(made, sort)
