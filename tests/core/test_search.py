"""A search study in the database: its space checked, trials asked within the budget and
max_parallel as jobs end, judged by its pruner from its rows, on Postgres and SQLite."""

from __future__ import annotations

import math
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import select

from core import jobs
from core.db.session import session_scope
from core.db.tables import Job, Study
from core.errors import InvalidError
from core.settings import Settings
from core.studies import search, service, space

BASE = {"model": {"name": "resnet8"}, "dataset": {"name": "digits"}, "recipe": {"epochs": 1}}
SPACE: dict[str, dict[str, Any]] = {
    "recipe.lr": {"type": "loguniform", "low": 0.01, "high": 0.5},
    "recipe.weight_decay": {"type": "loguniform", "low": 1e-5, "high": 1e-3},
    "model.name": {"type": "choice", "values": ["resnet8", "plain8"]},
}


def _request(**changes: Any) -> service.Request:
    found = search.Search(
        method=changes.pop("method", "random"),
        space=changes.pop("space", SPACE),
        trials=changes.pop("trials", 6),
        pruner=changes.pop("pruner", "none"),
        seed=changes.pop("seed", 0),
    )
    fields: dict[str, Any] = {"base": BASE, "grid": {}, "seeds": [0], "max_parallel": 2}
    return service.Request(**{**fields, **changes, "search": found})


def _create(url: str, request: service.Request) -> tuple[uuid.UUID, list[uuid.UUID]]:
    settings = Settings()
    with session_scope(url) as session:
        study = service.create(
            session=session, settings=settings, request=request, max_jobs=100, max_attempts=3
        )
        return study.id, service.release(session=session, settings=settings, study_id=study.id)


def _end(url: str, job_id: uuid.UUID, status: str, points: dict[int, float]) -> list[uuid.UUID]:
    """Run a trial's job to `status` with its val/error points; the trials asked after."""
    with session_scope(url) as session:
        claimed = jobs.claim(
            session=session, job_id=job_id, worker="w", device="cpu", lease_seconds=60
        )
        assert claimed is not None
        jobs.write_metrics(
            session=session,
            job_id=job_id,
            token=claimed.token,
            points=[jobs.Point("val/error", step, value) for step, value in points.items()],
        )
        jobs.finish(session=session, job_id=job_id, token=claimed.token, status=status)
    with session_scope(url) as session:
        return service.release_after(session=session, settings=Settings(), job_id=job_id)


def test_a_space_becomes_optunas_distributions_and_bad_parameters_are_named() -> None:
    found = space.distributions(SPACE)
    assert found["recipe.lr"].log is True  # type: ignore[attr-defined]
    assert found["model.name"].choices == ("resnet8", "plain8")  # type: ignore[attr-defined]
    bad: dict[str, dict[str, Any]] = {
        "recipe.lr": {"type": "loguniform", "low": 0, "high": 1},
        "recipe.epochs": {"type": "int", "low": 3, "high": 1},
        "recipe.momentum": {"type": "normal"},
        "model.name": {"type": "choice", "values": []},
    }
    messages = {
        "recipe.lr": "log scale, so low must be above 0",
        "recipe.epochs": "low 3 above high 1",
        "recipe.momentum": "needs a type, one of choice, uniform, loguniform, int",
        "model.name": "needs a non-empty list of values",
    }
    for path, param in bad.items():
        with pytest.raises(InvalidError, match=messages[path]) as caught:
            space.distributions({path: param})
        assert caught.value.field == ("body", "space", path)


def test_a_bound_that_makes_no_valid_spec_is_refused_before_anything_is_written(
    database_url: str,
) -> None:
    wrong = {"recipe.lr": {"type": "uniform", "low": 0.1, "high": 1e9}}
    with pytest.raises(InvalidError, match=r"'recipe.lr' at 1000000000.0: recipe.lr") as caught:
        _create(database_url, _request(space=wrong))
    assert caught.value.field == ("body", "space", "recipe.lr")
    names = {"model.name": {"type": "choice", "values": ["resnet8", "resnet9"]}}
    with pytest.raises(InvalidError, match=r"'model\.name' at 'resnet9'"):
        _create(database_url, _request(space=names))
    with pytest.raises(InvalidError, match="a search runs each trial on one seed"):
        _create(database_url, _request(seeds=[0, 1]))
    with pytest.raises(InvalidError, match="takes no grid"):
        _create(database_url, _request(grid={"recipe.lr": [0.1]}))
    with session_scope(database_url) as session:
        assert session.scalars(select(Study).where(Study.search.is_not(None))).all() == []


def test_trials_are_asked_up_to_max_parallel_then_one_per_ended_job_until_the_budget(
    database_url: str,
) -> None:
    study_id, first = _create(database_url, _request(trials=5, max_parallel=2))
    assert len(first) == 2
    asked = list(first)
    ended = 0
    while ended < len(asked):
        asked += _end(database_url, asked[ended], "succeeded", {10: 0.5 - 0.01 * ended})
        ended += 1
    assert len(asked) == 5
    with session_scope(database_url) as session:
        study = session.get(Study, study_id)
        assert study is not None
        assert [cell["trial"] for cell in study.cells] == [0, 1, 2, 3, 4]
        trials = session.scalars(select(Job).where(Job.study_id == study_id).order_by(Job.cell))
        for job, cell in zip(trials, study.cells, strict=True):
            assert job.spec["recipe"]["lr"] == cell["values"]["recipe.lr"]
            assert job.spec["model"]["name"] == cell["values"]["model.name"]
            assert 0.01 <= job.spec["recipe"]["lr"] <= 0.5
        # Sampled afresh each time, not the same first draw of a reseeded sampler.
        assert len({cell["values"]["recipe.lr"] for cell in study.cells}) == 5
        by_status = service.counts(session=session, study_id=study_id)
        assert service.state(study, by_status) == "succeeded"


def test_a_search_runs_until_its_last_trial_is_asked_and_a_cancelled_one_asks_no_more(
    database_url: str,
) -> None:
    study_id, first = _create(database_url, _request(trials=4, max_parallel=1))
    _end(database_url, first[0], "succeeded", {10: 0.4})
    with session_scope(database_url) as session:
        study = session.get(Study, study_id)
        assert study is not None
        assert service.state(study, service.counts(session=session, study_id=study_id)) in (
            "running",
            "queued",
        )
        service.cancel(session=session, study_id=study_id)
    with session_scope(database_url) as session:
        assert service.release(session=session, settings=Settings(), study_id=study_id) == []
        study = session.get(Study, study_id)
        assert study is not None
        assert service.state(study, service.counts(session=session, study_id=study_id)) == (
            "cancelled"
        )


def test_the_reaper_finds_a_search_with_trials_left_to_ask_for(database_url: str) -> None:
    study_id, _ = _create(database_url, _request(trials=3, max_parallel=1))
    with session_scope(database_url) as session:
        assert study_id in service.studies_with_held_jobs(session=session)


def test_tpe_samples_near_the_best_trials_once_past_its_random_start(database_url: str) -> None:
    """A quadratic in log lr with its minimum at 0.05: TPE's later draws are nearer it."""

    lr_only = {"recipe.lr": {"type": "loguniform", "low": 0.001, "high": 1.0}}
    study_id, asked = _create(database_url, _request(method="tpe", space=lr_only, trials=24))
    done = 0
    with session_scope(database_url) as session:
        lrs = {job.id: job.spec["recipe"]["lr"] for job in session.scalars(select(Job))}
    while done < len(asked):
        job_id = asked[done]
        with session_scope(database_url) as session:
            job = session.get(Job, job_id)
            assert job is not None
            lr = job.spec["recipe"]["lr"]
        lrs[job_id] = lr
        asked += _end(database_url, job_id, "succeeded", {10: (math.log10(lr / 0.05)) ** 2})
        done += 1
    with session_scope(database_url) as session:
        study = session.get(Study, study_id)
        assert study is not None
        distance = [abs(math.log10(c["values"]["recipe.lr"] / 0.05)) for c in study.cells]
    early, late = distance[:8], distance[-8:]
    assert sum(late) / 8 < sum(early) / 8


def test_the_median_pruner_judges_a_trial_from_the_rows_of_the_others(database_url: str) -> None:
    _, asked = _create(database_url, _request(pruner="median", trials=6, max_parallel=1))
    for job_id in asked[:1]:
        asked += _end(database_url, job_id, "succeeded", {10: 0.30, 20: 0.20})
    asked += _end(database_url, asked[1], "succeeded", {10: 0.32, 20: 0.22})
    running = asked[2]
    with session_scope(database_url) as session:
        jobs.claim(session=session, job_id=running, worker="w", device="cpu", lease_seconds=60)
    with session_scope(database_url) as session:
        judge = search.Judge.of_job(session, running)
        assert judge is not None
        assert judge.metric == "val/error"
        assert judge.prunes(session, 10, 0.25) is None  # better than the median at 10
    with session_scope(database_url) as session:
        reason = judge.prunes(session, 20, 0.60)
    assert reason == "pruned by the median pruner at step 20: val/error 0.6"


def test_asha_keeps_its_rungs_in_the_trials_cells_across_rebuilds(database_url: str) -> None:
    study_id, asked = _create(database_url, _request(pruner="asha", trials=6, max_parallel=1))
    with session_scope(database_url) as session:
        jobs.claim(session=session, job_id=asked[0], worker="w", device="cpu", lease_seconds=60)
        judge = search.Judge.of_job(session, asked[0])
        assert judge is not None
    with session_scope(database_url) as session:
        assert judge.prunes(session, 10, 0.3) is None  # alone at its rung: promoted
    with session_scope(database_url) as session:
        study = session.get(Study, study_id)
        assert study is not None
        assert study.cells[0]["system_attrs"] == {"completed_rung_0": 0.3}


def test_a_pruned_trial_retried_is_not_judged_again(database_url: str) -> None:
    _, asked = _create(database_url, _request(pruner="median", trials=3, max_parallel=1))
    with session_scope(database_url) as session:
        claimed = jobs.claim(
            session=session, job_id=asked[0], worker="w", device="cpu", lease_seconds=60
        )
        assert claimed is not None
        jobs.finish(session=session, job_id=asked[0], token=claimed.token, status="pruned")
    with session_scope(database_url) as session:
        jobs.retry(session=session, settings=Settings(), job_id=asked[0])
    with session_scope(database_url) as session:
        assert search.Judge.of_job(session, asked[0]) is None


def test_two_askers_at_once_never_sample_one_trial_twice(database_url: str) -> None:
    """Two processes' releases of one search at the same moment (threads here, each with a
    session of its own) ask for distinct trials within the budget."""
    settings = Settings()
    with session_scope(database_url) as session:
        study = service.create(
            session=session,
            settings=settings,
            request=_request(trials=6, max_parallel=6),
            max_jobs=100,
            max_attempts=3,
        )
        study_id = study.id
    start = threading.Barrier(2)

    def release() -> list[uuid.UUID]:
        start.wait()
        with session_scope(database_url) as session:
            return service.release(session=session, settings=settings, study_id=study_id)

    with ThreadPoolExecutor(2) as pool:
        asked = [job_id for found in pool.map(lambda _: release(), range(2)) for job_id in found]
    assert len(asked) == len(set(asked)) == 6
    with session_scope(database_url) as session:
        ended = session.get(Study, study_id)
        assert ended is not None
        assert [cell["trial"] for cell in ended.cells] == [0, 1, 2, 3, 4, 5]
        cells = session.scalars(select(Job.cell).where(Job.study_id == study_id))
        assert sorted(cell or 0 for cell in cells) == [0, 1, 2, 3, 4, 5]
