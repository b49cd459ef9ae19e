"""Studies over HTTP on Postgres and Redis: submit a grid or a preset, hold to max_parallel,
refuse a bad cell with nothing written, aggregate exactly, cancel and delete."""

from __future__ import annotations

import csv
import io
import statistics
import uuid
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from core import jobs
from core.db.session import session_scope
from core.db.tables import Job, Study
from core.settings import Settings
from core.studies import service as studies
from tests.helpers import claim, finish, queued_ids

STUDIES = "/api/v1/studies"
BASE = {
    "model": {"name": "resnet8"},
    "dataset": {"name": "digits"},
    "recipe": {"epochs": 1, "batch_size": 64, "augment": False},
}
GRID = {"model.name": ["plain8", "resnet8"], "recipe.lr": [0.1, 0.05]}


def _count(url: str, table: type[Job] | type[Study]) -> int:
    with session_scope(url) as session:
        return session.scalar(select(func.count()).select_from(table)) or 0


def _submit(client: TestClient, **extra: Any) -> dict[str, Any]:
    body = {"base": BASE, "grid": GRID, "seeds": 2, "max_parallel": 3, **extra}
    response = client.post(STUDIES, json=body)
    assert response.status_code == 202, response.text
    return dict(response.json())


def test_a_grid_expands_into_held_jobs_and_max_parallel_of_them_are_enqueued(
    client: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    study = _submit(client, name="lr sweep", tags=["sweep"])
    assert study["state"] == "queued"
    assert study["counts"] == {
        "queued": 8, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0, "pruned": 0,
        "done": 0, "total": 8,
    }  # fmt: skip
    assert [cell["values"] for cell in study["cells"]] == [
        {"model.name": "plain8", "recipe.lr": 0.1},
        {"model.name": "plain8", "recipe.lr": 0.05},
        {"model.name": "resnet8", "recipe.lr": 0.1},
        {"model.name": "resnet8", "recipe.lr": 0.05},
    ]
    held = [job for job in study["jobs"] if job["held"]]
    released = [job["id"] for job in study["jobs"] if not job["held"]]
    assert (len(held), len(released)) == (5, 3)
    assert sorted(queued_ids(queue)) == sorted(released)
    with session_scope(settings.database_url) as session:
        rows = session.scalars(select(Job).where(Job.study_id == uuid.UUID(study["id"]))).all()
        specs = {(row.cell, row.spec["recipe"]["seed"]): row.spec for row in rows}
    assert len(specs) == 8  # every cell x seed once
    assert specs[(3, 1)]["model"]["name"] == "resnet8"
    assert specs[(3, 1)]["recipe"]["lr"] == 0.05
    assert specs[(3, 1)]["tags"] == ["sweep"]
    listed = client.get(f"/api/v1/jobs?study={study['id']}&limit=50").json()["items"]
    assert len(listed) == 8


def test_a_bad_cell_is_a_422_naming_it_and_nothing_is_written(
    client: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    before = (_count(settings.database_url, Job), _count(settings.database_url, Study))
    body = {"base": BASE, "grid": {"model.name": ["resnet8", "resnet21"]}, "seeds": 2}
    response = client.post(STUDIES, json=body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["message"].startswith("cell 1 (model.name='resnet21'): model:")
    assert "6n+2" in error["message"]
    assert error["details"][0]["loc"] == ["body", "grid", "model.name"]
    bad_axis = client.post(STUDIES, json={"base": BASE, "grid": {"colour": ["red"]}})
    assert bad_axis.status_code == 422
    assert "grid axis 'colour'" in bad_axis.json()["error"]["message"]
    assert (_count(settings.database_url, Job), _count(settings.database_url, Study)) == before
    assert queued_ids(queue) == []


def test_a_study_over_the_size_limit_is_a_422(client: TestClient) -> None:
    body = {"base": BASE, "grid": {"recipe.lr": [0.1 / (i + 1) for i in range(101)]}}
    response = client.post(STUDIES, json={**body, "seeds": 10})
    assert response.status_code == 422
    assert "101 cells (101 axis values) x 10 seeds = 1010 jobs, over the limit of 1000" in (
        response.text
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"grid": GRID}, "give either a preset"),
        ({"preset": "degradation", "base": BASE}, "give either a preset"),
        ({"preset": "degradation"}, "a preset takes a dataset"),
        ({"base": BASE, "seeds": 0}, "seeds must be from 1 to 1000"),
        ({"base": BASE, "seeds": [1, 1]}, "without repeats"),
        ({"preset": "fig99", "dataset": {"name": "digits"}}, "preset 'fig99'"),
    ],
)
def test_malformed_study_requests_are_422(
    client: TestClient, body: dict[str, Any], message: str
) -> None:
    response = client.post(STUDIES, json=body)
    assert response.status_code == 422
    assert message in response.json()["error"]["message"]


def test_the_same_idempotency_key_gives_the_same_study_once(
    client: TestClient, settings: Settings
) -> None:
    body = {"base": BASE, "grid": {"recipe.lr": [0.1]}, "seeds": 1}
    headers = {"Idempotency-Key": f"study-{uuid.uuid4()}"}
    first = client.post(STUDIES, json=body, headers=headers)
    again = client.post(STUDIES, json=body, headers=headers)
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    other = client.post(STUDIES, json={**body, "seeds": 2}, headers=headers)
    assert other.status_code == 409


def test_a_dry_run_counts_the_jobs_and_writes_nothing(
    client: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    before = _count(settings.database_url, Study)
    body = {"preset": "degradation", "dataset": {"name": "fashion_mnist"}, "seeds": 3}
    preview = client.post(STUDIES, json=body, params={"dry_run": True})
    assert preview.status_code == 200
    answer = preview.json()
    assert answer["jobs"] == len(answer["cells"]) * 3
    assert {cell["values"]["model.name"] for cell in answer["cells"]} >= {"plain20", "resnet56"}
    assert _count(settings.database_url, Study) == before
    assert queued_ids(queue) == []


def test_presets_are_listed_with_their_source_and_expand(client: TestClient) -> None:
    listed = {preset["name"]: preset for preset in client.get(f"{STUDIES}/presets").json()}
    assert {"degradation", "cifar_depth", "shortcut_options", "units", "preact"} <= set(listed)
    assert "Fig. 6" in listed["degradation"]["source"]
    assert listed["degradation"]["recipe"]["quick"]
    body = {"preset": "cifar_depth", "dataset": {"name": "digits"}, "seeds": 1}
    study = client.post(STUDIES, json=body).json()
    assert study["preset"] == "cifar_depth"
    papers = {cell["values"]["model.name"]: cell["paper"] for cell in study["cells"]}
    assert papers["resnet20"] == pytest.approx(0.0875)


def _finish_all(settings: Settings, study_id: str) -> dict[uuid.UUID, tuple[float, float]]:
    """Run every job of the study by hand with made-up results; (final, best) per job."""
    made: dict[uuid.UUID, tuple[float, float]] = {}
    with session_scope(settings.database_url) as session:
        ids = list(session.scalars(select(Job.id).where(Job.study_id == uuid.UUID(study_id))))
    for number, job_id in enumerate(sorted(ids)):
        with session_scope(settings.database_url) as session:
            session.get(Job, job_id).held = False  # type: ignore[union-attr]
        token = claim(settings.database_url, job_id)
        final, best = 0.3 + 0.01 * number, 0.2 + 0.013 * (number % 3)
        with session_scope(settings.database_url) as session:
            points = [
                jobs.Point("train/error", step, 0.9 - 0.1 * step + 0.001 * number)
                for step in (1, 2, 3)
            ]
            jobs.write_metrics(session=session, job_id=job_id, token=token, points=points)
        finish(settings.database_url, job_id, token, final_test_error=final, best_test_error=best)
        made[job_id] = (final, best)
    return made


def test_results_are_exact_statistics_of_the_jobs_rows(
    client: TestClient, settings: Settings
) -> None:
    study = _submit(client, seeds=3)
    made = _finish_all(settings, study["id"])
    answer = client.get(f"{STUDIES}/{study['id']}").json()
    assert answer["state"] == "succeeded"
    assert answer["counts"]["done"] == answer["counts"]["total"] == 12
    with session_scope(settings.database_url) as session:
        cells = {
            job_id: cell
            for job_id, cell in session.execute(
                select(Job.id, Job.cell).where(Job.study_id == uuid.UUID(study["id"]))
            )
        }
    for cell in answer["cells"]:
        mine = [job_id for job_id, index in cells.items() if index == cell["cell"]]
        finals = [made[job_id][0] for job_id in mine]
        bests = [made[job_id][1] for job_id in mine]
        trains = [0.6 + 0.001 * sorted(made).index(job_id) for job_id in mine]
        assert cell["seeds_done"] == [0, 1, 2]
        for name, values in (
            ("final_test_error", finals),
            ("best_test_error", bests),
            ("final_train_error", trains),
        ):
            assert cell[name]["median"] == pytest.approx(statistics.median(values))
            assert cell[name]["mean"] == pytest.approx(statistics.fmean(values))
            assert cell[name]["std"] == pytest.approx(statistics.stdev(values))
            assert cell[name]["min"] == pytest.approx(min(values))
            assert cell[name]["max"] == pytest.approx(max(values))

    table = list(
        csv.DictReader(io.StringIO(client.get(f"{STUDIES}/{study['id']}/results.csv").text))
    )
    assert len(table) == 4
    assert float(table[0]["final_test_error_median"]) == pytest.approx(
        answer["cells"][0]["final_test_error"]["median"]
    )
    markdown = client.get(f"{STUDIES}/{study['id']}/results.md").text
    assert markdown.startswith("| model.name | recipe.lr | seeds |")
    assert "| plain8 | 0.1 | 3/3 |" in markdown

    curves = client.get(f"{STUDIES}/{study['id']}/curves", params={"metric": "train/error"})
    first = curves.json()["cells"][0]
    assert first["steps"] == [1, 2, 3]
    assert first["seeds"] == [3, 3, 3]
    order = sorted(made)
    at_three = [0.6 + 0.001 * order.index(job_id) for job_id, index in cells.items() if index == 0]
    assert first["center"][2] == pytest.approx(statistics.median(at_three))
    assert (first["lower"][2], first["upper"][2]) == pytest.approx((min(at_three), max(at_three)))
    std = client.get(f"{STUDIES}/{study['id']}/curves", params={"band": "std", "center": "mean"})
    band = std.json()["cells"][0]
    spread = statistics.stdev(at_three)
    assert band["upper"][2] - band["center"][2] == pytest.approx(spread)


def test_cancel_ends_every_unfinished_job_and_delete_removes_the_study(
    client: TestClient, settings: Settings
) -> None:
    study = _submit(client)
    one = uuid.UUID(next(job["id"] for job in study["jobs"] if not job["held"]))
    claim(settings.database_url, one)  # running now
    cancelled = client.post(f"{STUDIES}/{study['id']}/cancel").json()
    assert cancelled["counts"]["cancelled"] == 7
    assert cancelled["counts"]["running"] == 1  # asked to stop; its worker ends it
    refused = client.delete(f"{STUDIES}/{study['id']}")
    assert refused.status_code == 409
    with session_scope(settings.database_url) as session:
        token = session.get(Job, one).fencing_token  # type: ignore[union-attr]
        jobs.finish(session=session, job_id=one, token=token, status="cancelled")
    assert client.get(f"{STUDIES}/{study['id']}").json()["state"] == "cancelled"
    assert client.delete(f"{STUDIES}/{study['id']}").status_code == 204
    assert client.get(f"{STUDIES}/{study['id']}").status_code == 404
    with session_scope(settings.database_url) as session:
        left = session.scalar(
            select(func.count()).select_from(Job).where(Job.study_id == uuid.UUID(study["id"]))
        )
    assert left == 0


def test_reads_need_a_key(anonymous: TestClient) -> None:
    assert anonymous.get(STUDIES).status_code == 401
    assert anonymous.post(STUDIES, json={"base": BASE}).status_code == 401


def test_a_retried_job_of_a_study_takes_its_turn_within_max_parallel(
    client: TestClient, queue: redis.Redis, settings: Settings
) -> None:
    study = _submit(client, grid={"model.name": ["plain8", "resnet8"]}, seeds=1, max_parallel=1)
    first, second = (job["id"] for job in study["jobs"])
    assert client.post(f"/api/v1/jobs/{first}/cancel").json()["status"] == "cancelled"
    assert second in queued_ids(queue)  # the cancel let the next one go

    retried = client.post(f"/api/v1/jobs/{first}/retry")
    assert retried.status_code == 202, retried.text
    assert retried.json()["job"]["held"] is True  # one of one is queued already
    assert "waits, held, until its study has fewer than max_parallel" in retried.json()["message"]
    assert queued_ids(queue).count(first) == 1  # only its first delivery

    url = settings.database_url
    finish(url, uuid.UUID(second), claim(url, uuid.UUID(second)))
    with session_scope(url) as session:  # what the worker does once a job ends
        released = studies.release_after(
            session=session, settings=settings, job_id=uuid.UUID(second)
        )
    assert released == [uuid.UUID(first)]


def test_the_list_pages_newest_first_through_its_next_cursor_header(client: TestClient) -> None:
    made = [_submit(client, seeds=1, grid={})["id"] for _ in range(3)]
    first = client.get(STUDIES, params={"limit": 2})
    assert [study["id"] for study in first.json()] == made[::-1][:2]
    cursor = first.headers["Next-Cursor"]
    second = client.get(STUDIES, params={"limit": 2, "cursor": cursor})
    assert second.json()[0]["id"] == made[0]
    assert client.get(STUDIES, params={"cursor": "bm90LWEtY3Vyc29y"}).status_code == 422
