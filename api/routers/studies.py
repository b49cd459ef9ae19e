"""Studies: submit a grid of train jobs (or a preset of the papers), follow it, read its
results per cell beside the papers' numbers, as JSON, CSV, Markdown and curves."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query, Response, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from api import idempotency
from api.deps import ReadCaller, ReadKey, SessionDep, SettingsDep, TrainCaller
from api.errors import responses
from api.routers.jobs import commit_deleted
from api.schemas import (
    CellCurve,
    CellResult,
    ClaimResult,
    JobItem,
    StudyComparisonsOut,
    StudyCounts,
    StudyCurvesOut,
    StudyExtendIn,
    StudyIn,
    StudyItem,
    StudyOut,
    StudyPlanOut,
    StudyPresetOut,
    StudyPreview,
    StudyTrialsOut,
)
from client.wire import FINAL_STATUSES
from core import listing
from core.db.tables import Job, Study
from core.kinds import train
from core.queue import enqueue_committed
from core.settings import Settings
from core.studies import presets, results, search, service, trials

router = APIRouter(prefix="/studies", tags=["studies"])


@router.get("/presets", summary="The papers' experiments as presets", responses=responses(401, 403))
def list_presets(_: ReadKey) -> list[StudyPresetOut]:
    """Each preset with its source, what it shows, and its recipe at each scale."""
    return [
        StudyPresetOut(
            name=preset.name,
            title=preset.title,
            source=preset.source,
            description=preset.description,
            metric=preset.metric,
            note=preset.note,
            quick_datasets=list(preset.quick_datasets),
            recipe={scale: preset.recipe_note(scale) for scale in ("quick", "paper")},
        )
        for preset in presets.PRESETS.values()
    ]


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Submit a study: a preset, or a base spec with a grid",
    responses={
        200: {"model": StudyOut, "description": "An earlier study with the same Idempotency-Key"},
        **responses(401, 403, 409, 413, 422),
    },
)
def submit(
    body: Annotated[StudyIn, Body()],
    session: SessionDep,
    settings: SettingsDep,
    caller: TrainCaller,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    dry_run: Annotated[bool, Query(description="Check and count; write nothing.")] = False,
) -> StudyOut | StudyPreview:
    """Check every cell, write the study and its jobs, and start `max_parallel` of them.

    With `dry_run`, only check: the answer (200) is the cells and the job count."""
    if dry_run:
        response.status_code = status.HTTP_200_OK
        return _preview(_request(body), settings)
    owner = caller.owner
    found = idempotency.earlier(session, Study, idempotency_key, owner)
    if found is None:
        study = service.create(
            session=session,
            settings=settings,
            request=_request(body),
            max_jobs=settings.max_study_jobs,
            max_attempts=settings.max_attempts,
            max_families=settings.max_study_net_families,
            owner_key_id=owner,
            idempotency_key=idempotency_key,
        )
        # Its jobs read only what the caller may (the uploads their dataset reaches).
        train.check_stored(session, settings, _job_specs(session, study.id), caller)
        study.spec = {**study.spec, "request": body.model_dump(mode="json")}
        released = service.release(session=session, settings=settings, study_id=study.id)
        found = idempotency.commit_or_earlier(session, Study, idempotency_key, owner)
        if found is None:
            enqueue_committed(released, settings=settings)
            return _study_out(session, study)
    same = found.spec.get("request") == body.model_dump(mode="json")
    idempotency.replay(found, same=same, what="study", response=response)
    return _study_out(session, found)


def _job_specs(session: Session, study_id: uuid.UUID) -> list[dict[str, Any]]:
    """The stored specs of a study's jobs."""
    return list(session.scalars(select(Job.spec).where(Job.study_id == study_id)))


def _preview(request: service.Request, settings: Settings) -> StudyPreview:
    """What a request would make: its cells (with the papers' numbers) and its jobs; a
    search's space is checked, and its jobs are its trials (its cells are sampled later)."""
    if request.search is not None:
        service.check(request=request, settings=settings, max_jobs=settings.max_study_jobs)
        return StudyPreview(
            name=request.name,
            base=request.base,
            grid=request.grid,
            seeds=request.seeds,
            cells=[],
            jobs=request.search.trials,
        )
    expanded = service.expand(
        request=request,
        settings=settings,
        max_jobs=settings.max_study_jobs,
        max_families=settings.max_study_net_families,
    )
    preset = presets.get(request.preset) if request.preset else None
    return StudyPreview(
        name=request.name,
        base=request.base,
        grid=request.grid,
        seeds=request.seeds,
        cells=[
            {"values": cell, "paper": preset.paper_number(cell) if preset else None}
            for cell in expanded.cells
        ],
        jobs=len(expanded.jobs),
    )


def _request(body: StudyIn) -> service.Request:
    if body.preset is not None:
        assert body.dataset is not None  # StudyIn checks it
        return service.from_preset(
            body.preset,
            dataset=body.dataset,
            scale=body.scale,
            seeds=body.seed_list(),
            max_parallel=body.max_parallel,
            title=body.name,
            tags=tuple(body.tags),
        )
    assert body.base is not None
    found = None
    if body.search != "grid":
        assert body.trials is not None  # StudyIn checks it
        found = search.Search(
            method=body.search,
            space=body.space,
            trials=body.trials,
            pruner=body.pruner,
            objective=body.objective,
            seed=body.search_seed,
        )
    return service.Request(
        base=body.base,
        grid=body.grid,
        seeds=body.seed_list(),
        name=body.name,
        tags=tuple(body.tags),
        max_parallel=body.max_parallel,
        search=found,
    )


NEWEST = listing.newest(Study.created_at, Study.id, noun="study")
NEXT_CURSOR = "Next-Cursor"
NEXT_PAGE = "The cursor of the next page (pass it as `cursor`); absent on the last page."


@router.get(
    "",
    summary="List studies, newest first",
    responses={
        200: {"headers": {NEXT_CURSOR: {"description": NEXT_PAGE, "schema": {"type": "string"}}}},
        **responses(401, 403, 422),
    },
)
def list_studies(
    session: SessionDep,
    caller: ReadCaller,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None, Query(max_length=1000, description=f"The {NEXT_CURSOR} of a page.")
    ] = None,
) -> list[StudyItem]:
    """The newest studies (with READS_OWNER_ONLY, the caller's own), their state and counts;
    when there are more, the next page's cursor is the answer's Next-Cursor header."""
    rows, next_cursor = listing.page(
        session=session,
        query=select(Study),
        order=NEWEST,
        caller=caller,
        owner=Study.owner_key_id,
        limit=limit,
        cursor=cursor,
    )
    if next_cursor is not None:
        response.headers[NEXT_CURSOR] = next_cursor
    return [_study_item(session, study) for study in rows]


@router.get(
    "/{study_id}", summary="A study and its results", responses=responses(401, 403, 404, 422)
)
def read_study(study_id: uuid.UUID, session: SessionDep, caller: ReadCaller) -> StudyOut:
    """State, counts, each cell's statistics over seeds beside the papers' number, the jobs."""
    return _study_out(session, service.get(session=session, study_id=study_id, caller=caller))


@router.get(
    "/{study_id}/results.csv",
    summary="A study's results as CSV",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}}, **responses(401, 403, 404, 422)},
)
def results_csv(study_id: uuid.UUID, session: SessionDep, caller: ReadCaller) -> Response:
    """One row per cell: axis values, seeds, each error's statistics, the papers' number."""
    study = service.get(session=session, study_id=study_id, caller=caller)
    body = results.as_csv(study, results.cells(session=session, study=study))
    return Response(body, media_type="text/csv", headers=_attachment(study, "csv"))


@router.get(
    "/{study_id}/results.md",
    summary="A study's results as a Markdown table",
    response_class=Response,
    responses={200: {"content": {"text/markdown": {}}}, **responses(401, 403, 404, 422)},
)
def results_markdown(study_id: uuid.UUID, session: SessionDep, caller: ReadCaller) -> Response:
    """The table the way the papers print it: errors in %, ours beside theirs."""
    study = service.get(session=session, study_id=study_id, caller=caller)
    body = results.as_markdown(study, results.cells(session=session, study=study))
    return Response(body, media_type="text/markdown")


def _attachment(study: Study, suffix: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="study-{study.id}.{suffix}"'}


@router.get(
    "/{study_id}/curves",
    summary="A metric per cell over seeds: centre and band",
    responses=responses(401, 403, 404, 422),
)
def read_curves(
    study_id: uuid.UUID,
    session: SessionDep,
    caller: ReadCaller,
    metric: Annotated[str, Query(max_length=100)] = "train/error",
    center: Literal["median", "mean"] = "median",
    band: Literal["minmax", "std"] = "minmax",
    max_points: Annotated[int, Query(ge=2, le=20_000)] = 500,
) -> StudyCurvesOut:
    """At each logged step, the median (or mean) over the cell's seeds with a min-max (or
    +-std) band; steps thinned evenly to `max_points`, each value exact."""
    study = service.get(session=session, study_id=study_id, caller=caller)
    found = results.curves(
        session=session, study=study, metric=metric, center=center, band=band, limit=max_points
    )
    return StudyCurvesOut(
        metric=metric,
        center=center,
        band=band,
        cells=[CellCurve.model_validate(cell) for cell in found],
    )


@router.post(
    "/{study_id}/cancel", summary="Cancel a study", responses=responses(401, 403, 404, 409, 422)
)
def cancel_study(study_id: uuid.UUID, session: SessionDep, caller: TrainCaller) -> StudyOut:
    """Every unfinished job: held and queued ones now, running ones within seconds.

    Only the key that submitted it, or an admin key, may cancel it (403)."""
    study = service.cancel(session=session, study_id=study_id, caller=caller)
    session.commit()
    return _study_out(session, study)


@router.post(
    "/{study_id}/extend",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Add seeds or trials to a study",
    responses=responses(401, 403, 404, 409, 422),
)
def extend_study(
    study_id: uuid.UUID,
    body: StudyExtendIn,
    session: SessionDep,
    settings: SettingsDep,
    caller: TrainCaller,
) -> StudyOut:
    """Seeds for every cell or chosen cells (a grid), or trials (a search), in one request;
    the new jobs start within the study's `max_parallel` and join its results.

    Only the key that submitted it, or an admin key, may extend it (403); a cancelled study
    is a 409."""
    study = service.extend(
        session=session,
        settings=settings,
        study_id=study_id,
        add_seeds=body.seeds_by_cell(),
        add_trials=body.add_trials,
        caller=caller,
    )
    train.check_stored(session, settings, _job_specs(session, study.id), caller)
    released = service.release(session=session, settings=settings, study_id=study.id)
    session.commit()
    enqueue_committed(released, settings=settings)
    return _study_out(session, study)


@router.delete(
    "/{study_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Delete a study, its jobs and their artifacts",
    responses=responses(401, 403, 404, 409, 422, 503),
)
def delete_study(
    study_id: uuid.UUID, session: SessionDep, settings: SettingsDep, caller: TrainCaller
) -> None:
    """Remove a study none of whose jobs runs (cancel it first), its jobs and their files.

    Only the key that submitted it, or an admin key, may delete it (403)."""
    job_ids = service.delete(session=session, study_id=study_id, caller=caller)
    commit_deleted(session, settings, job_ids)


def _study_item(session: Session, study: Study) -> StudyItem:
    by_status = service.counts(session=session, study_id=study.id)
    done = sum(by_status[ended] for ended in FINAL_STATUSES)
    return StudyItem(
        id=study.id,
        name=study.name,
        tags=study.tags,
        preset=study.preset,
        scale=study.spec.get("scale"),
        state=service.state(study, by_status),
        counts=StudyCounts(**by_status, done=done, total=sum(by_status.values())),
        max_parallel=study.max_parallel,
        owner=study.owner_key_id,
        created_at=study.created_at,
    )


def _study_out(session: Session, study: Study) -> StudyOut:
    preset = presets.PRESETS.get(study.preset) if study.preset else None
    jobs = session.scalars(
        select(Job).where(Job.study_id == study.id).order_by(Job.cell, Job.created_at)
    )
    cells = results.cells(session=session, study=study)
    return StudyOut(
        **_study_item(session, study).model_dump(),
        spec=study.spec,
        metric=study.metric,
        source=preset.source if preset else None,
        note=preset.note if preset else None,
        cells=[CellResult.model_validate(cell) for cell in cells],
        jobs=[JobItem.of(job) for job in jobs],
        claims=[ClaimResult.model_validate(claim) for claim in results.claims(study, cells)],
    )


# What the seeds say with confidence: compare cells, plan the seeds an open claim needs.


@router.get(
    "/{study_id}/compare",
    summary="Compare cells on a metric: p-values, effect sizes",
    responses=responses(401, 403, 404, 422),
)
def compare_cells(
    study_id: uuid.UUID,
    session: SessionDep,
    caller: ReadCaller,
    metric: Annotated[str, Query(max_length=100)] = "final_test_error",
    test: Literal["welch", "mannwhitney"] = "welch",
    reference: Annotated[int | None, Query(description="Every cell against this one.")] = None,
    a: Annotated[int | None, Query(description="With b: these two cells.")] = None,
    b: Annotated[int | None, Query(description="With a: these two cells.")] = None,
    level: Annotated[float, Query(gt=0, lt=1)] = results.LEVEL,
) -> StudyComparisonsOut:
    """Cells a and b, or every cell against `reference`, or every pair (up to 20 cells):
    two-sided p Holm-adjusted across the comparisons, the effect size, the lower cell."""
    study = service.get(session=session, study_id=study_id, caller=caller)
    found = results.comparisons(
        study,
        results.cells(session=session, study=study),
        metric=metric,
        test=test,
        reference=reference,
        a=a,
        b=b,
        level=level,
    )
    return StudyComparisonsOut.model_validate(found)


@router.get(
    "/{study_id}/plan",
    summary="The seeds per cell that would settle the open claims",
    responses=responses(401, 403, 404, 422),
)
def plan_seeds(
    study_id: uuid.UUID,
    session: SessionDep,
    caller: ReadCaller,
    level: Annotated[float, Query(gt=0, lt=1)] = results.LEVEL,
    power: Annotated[float, Query(gt=0, lt=1)] = results.POWER,
) -> StudyPlanOut:
    """Per claim its verdict at `level` and, where inconclusive, the seeds per cell a
    one-sided Welch t-test needs for `power`; `extend` is the body that adds them."""
    study = service.get(session=session, study_id=study_id, caller=caller)
    found = results.plan(
        study, results.cells(session=session, study=study), level=level, power=power
    )
    return StudyPlanOut.model_validate(found)


# A search study's trials: each trial's parameters, objective and cost, and what they show.


@router.get(
    "/{study_id}/trials",
    summary="A search's trials, best trial, importances and compute",
    responses=responses(401, 403, 404, 409, 422),
)
def read_trials(study_id: uuid.UUID, session: SessionDep, caller: ReadCaller) -> StudyTrialsOut:
    """Per trial: its job, status, parameters, objective (last and best point), steps and
    job-seconds; the best completed trial with its job's spec, the best value so far over
    trial number, fANOVA importances, parallel coordinates, and job-seconds by status.

    A grid study has no trials (409): its results are per cell, in GET /studies/{id}."""
    study = service.get(session=session, study_id=study_id, caller=caller)
    search = trials.search_of(study)
    found = trials.rows(session, study)
    minimize = trials.minimizes(search)
    top = trials.best(found, minimize=minimize)
    return StudyTrialsOut.model_validate(
        {
            "method": search.get("method", "random"),
            "objective": search["objective"],
            "direction": "minimize" if minimize else "maximize",
            "trials": [dataclasses.asdict(row) for row in found],
            "best": None if top is None else dataclasses.asdict(top),
            "best_so_far": trials.best_so_far(found, minimize=minimize),
            "importances": trials.importances(study, found),
            "parallel": trials.parallel(study, found),
            "job_seconds": trials.seconds_by_status(found),
        }
    )


@router.get(
    "/{study_id}/trials.csv",
    summary="A search's trials as CSV",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}}, **responses(401, 403, 404, 409, 422)},
)
def trials_csv(study_id: uuid.UUID, session: SessionDep, caller: ReadCaller) -> Response:
    """One row per trial: number, job, status, each parameter, the objective's last and best
    value, steps, job-seconds, the step it was pruned at."""
    study = service.get(session=session, study_id=study_id, caller=caller)
    body = trials.as_csv(study, trials.rows(session, study))
    headers = {"Content-Disposition": f'attachment; filename="study-{study.id}-trials.csv"'}
    return Response(body, media_type="text/csv", headers=headers)
