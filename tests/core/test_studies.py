"""A study's grid and life in the database: cells, validation, release to max_parallel."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import select

from core import jobs
from core.db.session import session_scope
from core.db.tables import Job, Study
from core.errors import InvalidError
from core.settings import Settings
from core.studies import grid, results, service

BASE = {"model": {"name": "resnet8"}, "dataset": {"name": "digits"}, "recipe": {"epochs": 1}}


def test_cells_are_the_product_of_the_axes_first_axis_slowest() -> None:
    found = grid.cells(
        {"model.name": ["plain8", "resnet8"], "options.unit": ["original", "full_preact"]}
    )
    assert found == [
        {"model.name": "plain8", "options.unit": "original"},
        {"model.name": "plain8", "options.unit": "full_preact"},
        {"model.name": "resnet8", "options.unit": "original"},
        {"model.name": "resnet8", "options.unit": "full_preact"},
    ]


def test_a_cell_sets_its_values_into_a_copy_of_the_base_with_its_seed() -> None:
    cell = {"options.unit": "full_preact", "recipe.lr": 0.05, "dataset.train_limit": 100}
    payload = grid.payload_of(BASE, cell, 3, name="units", tags=["t"])
    assert payload["model"] == {"name": "resnet8", "options": {"unit": "full_preact"}}
    assert payload["recipe"] == {"epochs": 1, "lr": 0.05, "seed": 3}
    assert payload["dataset"] == {"name": "digits", "train_limit": 100}
    assert (
        payload["name"]
        == "units: options.unit=full_preact, recipe.lr=0.05, dataset.train_limit=100, seed 3"
    )
    assert BASE["recipe"] == {"epochs": 1}  # the base is not touched


def test_expansion_is_seed_major_and_every_cell_is_validated() -> None:
    settings = Settings()
    expanded = grid.expand(
        BASE,
        {"model.name": ["plain8", "resnet8"]},
        [0, 7],
        settings=settings,
        name=None,
        tags=[],
        max_jobs=10,
    )
    assert [(cell, seed) for cell, seed, _ in expanded.jobs] == [(0, 0), (1, 0), (0, 7), (1, 7)]
    assert expanded.jobs[3][2].recipe.seed == 7
    with pytest.raises(InvalidError, match=r"cell 1 \(recipe.lr=-1\): recipe.lr:") as caught:
        grid.expand(
            BASE, {"recipe.lr": [0.1, -1]}, [0], settings=settings, name=None, tags=[], max_jobs=10
        )
    assert caught.value.field == ("body", "grid", "recipe.lr")
    with pytest.raises(InvalidError, match="over the limit of 3"):
        grid.expand(
            BASE,
            {"recipe.lr": [0.1, 0.2]},
            [0, 1],
            settings=settings,
            name=None,
            tags=[],
            max_jobs=3,
        )
    with pytest.raises(InvalidError, match="must be a field path"):
        grid.expand(BASE, {"lr": [0.1]}, [0], settings=settings, name=None, tags=[], max_jobs=3)


def _study(url: str, max_parallel: int) -> tuple[uuid.UUID, list[uuid.UUID]]:
    request = service.Request(
        base=BASE, grid={"recipe.lr": [0.1, 0.05, 0.02]}, seeds=[0, 1], max_parallel=max_parallel
    )
    with session_scope(url) as session:
        study = service.create(
            session=session, settings=Settings(), request=request, max_jobs=100, max_attempts=3
        )
        released = service.release(session=session, settings=Settings(), study_id=study.id)
        return study.id, released


def _held(url: str, study_id: uuid.UUID) -> int:
    with session_scope(url) as session:
        rows = session.scalars(select(Job.held).where(Job.study_id == study_id))
        return sum(rows)


def test_at_most_max_parallel_jobs_are_released_and_an_end_releases_the_next(
    database_url: str,
) -> None:
    study_id, released = _study(database_url, max_parallel=2)
    assert len(released) == 2
    assert _held(database_url, study_id) == 4
    with session_scope(database_url) as session:
        assert (
            service.release(session=session, settings=Settings(), study_id=study_id) == []
        )  # still full
        claimed = jobs.claim(
            session=session, job_id=released[0], worker="w", device="cpu", lease_seconds=60
        )
        assert claimed is not None
        blocked = session.scalars(
            select(Job.id).where(Job.study_id == study_id, Job.held.is_(True))
        ).first()
        assert blocked is not None
        # A held job cannot be claimed, whoever delivers it.
        assert (
            jobs.claim(session=session, job_id=blocked, worker="w", device="cpu", lease_seconds=60)
            is None
        )
    with session_scope(database_url) as session:
        jobs.finish(session=session, job_id=released[0], token=claimed.token, status="succeeded")
        following = service.release_after(session=session, settings=Settings(), job_id=released[0])
    assert len(following) == 1
    assert _held(database_url, study_id) == 3
    with session_scope(database_url) as session:
        by_status = service.counts(session=session, study_id=study_id)
        study = service.get(session=session, study_id=study_id)
        assert service.state(study, by_status) == "running"
        assert service.studies_with_held_jobs(session=session) == [study_id]


def test_a_held_job_is_not_counted_as_waiting_on_the_broker(database_url: str) -> None:
    with session_scope(database_url) as session:
        before = jobs.count_queued(session=session)
    _study(database_url, max_parallel=1)
    with session_scope(database_url) as session:
        assert jobs.count_queued(session=session) == before + 1


def test_the_markdown_table_shows_an_option_cell_as_key_value_pairs() -> None:
    options = {"shortcut_variant": "exclusive_gating", "gate_bias": -6}
    study = Study(spec={"grid": {"model.options": [options]}}, metric="final_test_error")
    unfinished = {"median": None, "min": None, "max": None}
    row: dict[str, Any] = {
        "values": {"model.options": options},
        "seeds_done": [],
        "jobs": 2,
        **{error: unfinished for error in results.ERRORS},
        "paper": 0.087,
        "difference": None,
    }
    markdown = results.as_markdown(study, [row])
    assert "| shortcut_variant=exclusive_gating gate_bias=-6 | 0/2 |" in markdown
    assert "{" not in markdown


def test_a_cell_names_its_data_and_environments_and_warns_when_its_seeds_differ() -> None:
    gpu = {"torch": "2.4", "device": "NVIDIA H200", "device_type": "cuda", "git_commit": "ab" * 20}
    cpu = gpu | {"device": "AMD EPYC", "device_type": "cpu"}
    same = [Job(data_digest="sha256:" + "a" * 64, environment=gpu) for _ in range(2)]
    assert results.ran_on(same) == {
        "data_digests": ["sha256:" + "a" * 64],
        "environments": [results.environment_label(gpu)],
        "warnings": [],
    }
    mixed = [*same, Job(data_digest="sha256:" + "b" * 64, environment=cpu), Job()]
    found = results.ran_on(mixed)
    assert len(found["data_digests"]) == len(found["environments"]) == 2
    assert found["warnings"] == [
        "its jobs ran on 2 different data digests",
        "its jobs ran on 2 different environments",
    ]
    assert "NVIDIA H200 (cuda)" in results.environment_label(gpu)
    study = Study(spec={"grid": {"recipe.lr": [0.1]}}, metric="final_test_error")
    unfinished = {"median": None, "min": None, "max": None}
    row: dict[str, Any] = {"cell": 0, "values": {"recipe.lr": 0.1}, "seeds_done": [], "jobs": 4}
    row |= {error: unfinished for error in results.ERRORS} | {"paper": None, "difference": None}
    row |= found
    assert "Cell 0 (0.1): its jobs ran on 2 different data digests." in results.as_markdown(
        study, [row]
    )
