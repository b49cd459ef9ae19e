"""Jobs: submit, list (and as CSV), read, edit, cancel, delete; curves, checkpoints, events."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Query, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse
from pydantic import GetCoreSchemaHandler, ValidationError
from pydantic_core import CoreSchema, core_schema
from sqlalchemy import select
from sqlalchemy.orm import Session

from api import idempotency, jobs_csv
from api.deps import ReadCaller, ReadKey, SessionDep, SettingsDep, TrainCaller
from api.errors import responses
from api.schemas import (
    CheckpointOut,
    JobEdit,
    JobExportQuery,
    JobItem,
    JobOut,
    JobPage,
    JobQuery,
    KindOut,
    MetricsOut,
    RetryOut,
    Series,
)
from api.stream import job_events
from core import artifacts, job_queries, jobs, kinds, usage
from core.db.session import session_scope
from core.db.tables import Checkpoint, Job
from core.kinds import KINDS, JobSpec, KindSpec
from core.owners import Caller
from core.queue import enqueue_committed
from core.settings import Settings
from core.studies import service as studies

router = APIRouter(prefix="/jobs", tags=["jobs"])


class Documented:
    """A body documented as `shape` but handed over as the JSON sent, for a dependency to
    validate where it should."""

    def __init__(self, shape: Any) -> None:
        self.shape = shape

    def __get_pydantic_core_schema__(
        self, _source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(
            lambda value: value, json_schema_input_schema=handler.generate_schema(self.shape)
        )


# A train spec's validation counts its net's costs for the admission budgets (seconds for
# a net not counted yet, waiting while the zoo counts another). This dependency is a plain
# function, so the framework runs it in a worker thread: the spec is validated once, with
# the service's budgets, and the event loop never waits for it.
def _submitted(
    body: Annotated[Any, Documented(JobSpec), Body(title="Spec")], settings: SettingsDep
) -> KindSpec:
    """The body as a job spec within the service's budgets, or the 422 the framework
    answers for a body it validates."""
    try:
        return kinds.parse(body, settings)
    except ValidationError as error:
        problems = [
            {**problem, "loc": ("body", *problem["loc"])}
            for problem in error.errors(include_url=False)
        ]
        raise RequestValidationError(problems, body=body) from None


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Submit a job (train, evaluate, ...: see /jobs/kinds)",
    responses={
        200: {
            "model": JobOut,
            "description": "An earlier submission with the same Idempotency-Key",
        },
        **responses(401, 403, 409, 413, 422),
    },
)
def submit(
    session: SessionDep,
    settings: SettingsDep,
    caller: TrainCaller,
    spec: Annotated[KindSpec, Depends(_submitted)],  # after the caller: a 401/403 comes first
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobOut:
    """Validate, commit the queued job (owned by the caller's key), then put its id on the
    queue of what it needs (202)."""
    owner = caller.owner
    _check_source(session, settings, spec, caller)
    found = idempotency.earlier(session, Job, idempotency_key, owner)
    if found is None:
        usage.check_room(session=session, settings=settings, spec=spec, owner=owner)
        job = jobs.create(
            session=session,
            settings=settings,
            spec=spec,
            max_attempts=settings.max_attempts,
            owner_key_id=owner,
            idempotency_key=idempotency_key,
        )
        found = idempotency.commit_or_earlier(session, Job, idempotency_key, owner)
        if found is None:
            enqueue_committed([job.id], settings=settings)
            return JobOut.of(job)
    same = _as_sent(found.spec) == _as_sent(spec.model_dump(mode="json"))
    idempotency.replay(found, same=same, what="job", response=response)
    return JobOut.of(found)


def _as_sent(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored spec less what its kind pinned on submission (a predict job's checkpoint, a
    fine-tune's)."""
    sent = {key: value for key, value in spec.items() if key != "resolved"}
    if isinstance(sent.get("init"), dict):
        sent["init"] = {key: value for key, value in sent["init"].items() if key != "resolved"}
    return sent


def _check_source(session: Session, settings: Settings, spec: KindSpec, caller: Caller) -> None:
    """What the job reads (the dataset's uploads, a model, a source job) must be readable by
    the caller; else a 422, as for what does not exist."""
    kinds.check_access(session, settings, spec, caller)


@router.get("", summary="List jobs: filter, sort, page", responses=responses(401, 403, 422))
def list_jobs(
    params: Annotated[JobQuery, Query()], session: SessionDep, caller: ReadCaller
) -> JobPage:
    """A page of jobs (with READS_OWNER_ONLY, the caller's own); follow `next_cursor`."""
    rows, next_cursor = job_queries.list_jobs(
        session=session, filters=params, caller=caller, limit=params.limit, cursor=params.cursor
    )
    return JobPage(items=[JobItem.of(row) for row in rows], next_cursor=next_cursor)


@router.get(
    ".csv",
    summary="Export the filtered job list as CSV",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}}, **responses(401, 403, 422)},
)
def export_jobs(
    params: Annotated[JobExportQuery, Query()], settings: SettingsDep, caller: ReadCaller
) -> StreamingResponse:
    """Every job the filters pass, in `sort` order, one row each, streamed: id, name, kind,
    status, model, dataset, tags (`;`-joined), note, times, the summary columns, then the
    `columns` asked for."""
    body = jobs_csv.stream(settings.database_url, params, caller, params.fields())
    disposition = {"Content-Disposition": 'attachment; filename="jobs.csv"'}
    return StreamingResponse(body, media_type="text/csv", headers=disposition)


@router.get("/kinds", summary="The job kinds", responses=responses(401, 403))
def list_kinds(_: ReadKey) -> list[KindOut]:
    """Each kind `POST /jobs` accepts (the spec's `kind`), with what it does."""
    return [KindOut(kind=kind.name, description=kind.description) for kind in KINDS.values()]


@router.get("/{job_id}", summary="Read a job", responses=responses(401, 403, 404, 422))
def read_job(job_id: uuid.UUID, session: SessionDep, caller: ReadCaller) -> JobOut:
    """Status, attempts, timestamps, worker, device, error, progress, summary and spec."""
    return JobOut.of(jobs.get(session=session, job_id=job_id, caller=caller))


@router.patch(
    "/{job_id}", summary="Edit a job's tags and note", responses=responses(401, 403, 404, 422)
)
def edit_job(
    job_id: uuid.UUID, edit: Annotated[JobEdit, Body()], session: SessionDep, caller: TrainCaller
) -> JobOut:
    """Replace its tags, set or clear (null) its note; what is left out stays. Any status.

    Only the key that submitted it, or an admin key, may edit it (403)."""
    changes = edit.model_dump(include=edit.model_fields_set)
    job = jobs.edit(session=session, job_id=job_id, changes=changes, caller=caller)
    session.commit()
    return JobOut.of(job)


@router.post(
    "/{job_id}/cancel", summary="Cancel a job", responses=responses(401, 403, 404, 409, 422)
)
def cancel_job(
    job_id: uuid.UUID, session: SessionDep, settings: SettingsDep, caller: TrainCaller
) -> JobOut:
    """A queued job is cancelled now; a running one when its worker next checks (seconds).

    Only the key that submitted it, or an admin key, may cancel it (403)."""
    job = jobs.request_cancel(session=session, job_id=job_id, caller=caller)
    released = studies.release_after(session=session, settings=settings, job_id=job_id)
    session.commit()
    enqueue_committed(released, settings=settings)  # a cancelled study job makes room
    return JobOut.of(job)


@router.post(
    "/{job_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Retry a failed, cancelled or pruned job",
    responses=responses(401, 403, 404, 409, 422),
)
def retry_job(
    job_id: uuid.UUID, session: SessionDep, settings: SettingsDep, caller: TrainCaller
) -> RetryOut:
    """Queue the job again; it resumes from its last verified checkpoint on the same step
    axis (its metrics continue), or starts over when it has none, as the answer says. A
    study's job takes its turn within the study's `max_parallel`.

    409 unless it failed, was cancelled or was pruned; only its owner or an admin key may
    (403)."""
    retried = jobs.retry(session=session, settings=settings, job_id=job_id, caller=caller)
    message = retried.message
    goes = studies.takes_turn(session=session, settings=settings, job=retried.job)
    session.commit()
    if goes:
        enqueue_committed([job_id], settings=settings)
    else:
        message += "; it waits, held, until its study has fewer than max_parallel jobs running"
    return RetryOut(job=JobOut.of(retried.job), resume_step=retried.resume_step, message=message)


@router.delete(
    "/{job_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Delete a job, its rows and its artifacts",
    responses=responses(401, 403, 404, 409, 422, 503),
)
def delete_job(
    job_id: uuid.UUID, session: SessionDep, settings: SettingsDep, caller: TrainCaller
) -> None:
    """Remove a job that is not running (cancel it first), its metrics, events and files.

    Only the key that submitted it, or an admin key, may delete it (403)."""
    jobs.delete(session=session, job_id=job_id, caller=caller)
    commit_deleted(session, settings, [job_id])


def commit_deleted(session: Session, settings: Settings, job_ids: Sequence[uuid.UUID]) -> None:
    """Commit the deletion of jobs' rows, and remove their files."""
    # Objects go before the rows commit: an unreachable store is a 503 that keeps both.
    for job_id in job_ids:
        artifacts.delete_job_objects(settings, job_id)
    session.commit()  # the rows go first: a failed commit leaves the local files in place
    for job_id in job_ids:
        artifacts.delete_job(settings, job_id)


@router.get(
    "/{job_id}/metrics",
    summary="A job's metric curves, downsampled",
    response_model=MetricsOut,
    responses=responses(401, 403, 404, 422),
)
def read_metrics(
    job_id: uuid.UUID,
    session: SessionDep,
    settings: SettingsDep,
    caller: ReadCaller,
    names: Annotated[
        str | None, Query(max_length=2000, description="Comma-separated; default: all.")
    ] = None,
    max_points: Annotated[int, Query(ge=2, le=20_000, description="Per series.")] = 1000,
) -> Response:
    """Each series averaged over equal step buckets (point = bucket mean at its last step)."""
    job = jobs.get(session=session, job_id=job_id, caller=caller)
    wanted = tuple(sorted({name for name in (names or "").split(",") if name}))
    body = _curves(settings.database_url, job_id, job.updated_at, wanted, max_points)
    return Response(body, media_type="application/json")


# Every metric write goes through core.jobs' fence, which bumps the job's updated_at in
# the same transaction: (id, updated_at) names one version of a job's curves, so a
# finished job's curves are computed once, and a running job's once per write.
@lru_cache(maxsize=64)
def _curves(
    url: str, job_id: uuid.UUID, version: datetime, names: tuple[str, ...], max_points: int
) -> bytes:
    """The JSON of a job's downsampled curves at `version` (its updated_at)."""
    with session_scope(url) as session:
        found = job_queries.metric_series(
            session=session, job_id=job_id, names=names, max_points=max_points
        )
    series = {name: Series(steps=steps, values=values) for name, (steps, values) in found.items()}
    return MetricsOut(series=series).model_dump_json().encode()


@router.get(
    "/{job_id}/checkpoints",
    summary="A job's checkpoints",
    responses=responses(401, 403, 404, 422),
)
def list_checkpoints(
    job_id: uuid.UUID, session: SessionDep, caller: ReadCaller
) -> list[CheckpointOut]:
    """The checkpoint files the job keeps, by step, with their sha256."""
    jobs.get(session=session, job_id=job_id, caller=caller)
    query = select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
    return [CheckpointOut.of(row) for row in session.scalars(query)]


@router.get(
    "/{job_id}/events",
    summary="Follow a job live (Server-Sent Events)",
    response_class=Response,  # a stream of its own, not a generator FastAPI should encode
    responses={
        200: {
            "description": "Events `log` (with ids), `metrics`, `progress`, `status`, `end`.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **responses(401, 403, 404, 422),
    },
)
def follow_job(
    job_id: uuid.UUID,
    session: SessionDep,
    settings: SettingsDep,
    caller: ReadCaller,
    last_event_id: Annotated[
        int,
        Header(ge=0, le=2**63 - 1, description="Resume after this log line (set by browsers)."),
    ] = 0,
    since_step: Annotated[
        int | None,
        Query(ge=0, le=2**31 - 1, description="Metric points from this step; default: new only."),
    ] = None,
) -> EventSourceResponse:
    """Log lines, new metric points, progress and status until the job ends, then `end`."""
    jobs.get(session=session, job_id=job_id, caller=caller)
    stream = job_events(
        settings.database_url,
        job_id,
        poll_seconds=settings.stream_poll_seconds,
        last_event_id=last_event_id,
        since_step=since_step,
        max_seconds=settings.stream_max_seconds,
    )
    return EventSourceResponse(stream, headers={"Cache-Control": "no-cache"})
