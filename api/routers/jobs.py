"""Jobs: submit, list (and as CSV), read, edit, cancel, delete; curves, checkpoints, events."""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime
from functools import lru_cache
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api import idempotency, jobs_csv, queries
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
    JobSearch,
    KindOut,
    MetricsOut,
    RetryOut,
    Series,
)
from api.stream import job_events
from core import artifacts, jobs, kinds, usage
from core.db.session import session_scope
from core.db.tables import Checkpoint, Job
from core.errors import InvalidError, NotOwnedError
from core.kinds import KINDS, JobSpec
from core.owners import Caller
from core.queue import enqueue_committed
from core.settings import Settings
from core.studies import service as studies

router = APIRouter(prefix="/jobs", tags=["jobs"])


# A train spec's validation counts its net's costs for the admission budgets (seconds for
# a net not counted yet, waiting while the zoo counts another), and the framework
# validates a body on the event loop. This dependency, solved before the body, validates
# it in a worker thread first: the loop's validation then finds the counts cached.
_JOB_SPEC: TypeAdapter[JobSpec] = TypeAdapter(JobSpec)


async def _counted_off_the_loop(request: Request) -> None:
    try:
        body = await request.json()
    except ValueError:
        return  # the framework answers it
    await run_in_threadpool(_count, body)


def _count(body: Any) -> None:
    with contextlib.suppress(ValidationError):
        _JOB_SPEC.validate_python(body)


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Submit a job (train, evaluate, ...: see /jobs/kinds)",
    dependencies=[Depends(_counted_off_the_loop)],
    responses={
        200: {
            "model": JobOut,
            "description": "An earlier submission with the same Idempotency-Key",
        },
        **responses(401, 403, 409, 413, 422),
    },
)
def submit(
    spec: Annotated[JobSpec, Body()],
    session: SessionDep,
    settings: SettingsDep,
    caller: TrainCaller,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobOut:
    """Validate, commit the queued job (owned by the caller's key), then put its id on the
    train queue (202)."""
    owner = caller.owner
    _check_source(session, settings, spec, caller)
    found = idempotency.earlier(session, Job, idempotency_key, owner)
    if found is None:
        usage.check_room(session=session, settings=settings, spec=spec, owner=owner)
        job = jobs.create(
            session=session,
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


def _check_source(session: Session, settings: Settings, spec: JobSpec, caller: Caller) -> None:
    """What the job reads (the dataset's uploads, a model, a source job) must be readable by
    the caller; else a 422, as for what does not exist."""
    kinds.check_access(session, settings, spec, caller)


@router.get("", summary="List jobs: filter, sort, page", responses=responses(401, 403, 422))
def list_jobs(
    params: Annotated[JobQuery, Query()], session: SessionDep, caller: ReadCaller
) -> JobPage:
    """A page of jobs (with READS_OWNER_ONLY, the caller's own); follow `next_cursor`."""
    rows, next_cursor = queries.list_jobs(
        session=session,
        filters=_filters(params, caller),
        sort=params.sort,
        limit=params.limit,
        cursor=params.cursor,
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
    body = jobs_csv.stream(
        settings.database_url, _filters(params, caller), params.sort, params.fields()
    )
    disposition = {"Content-Disposition": 'attachment; filename="jobs.csv"'}
    return StreamingResponse(body, media_type="text/csv", headers=disposition)


def _filters(params: JobSearch, caller: Caller) -> queries.JobFilter:
    """The list's filters as asked, kept to what the caller may read."""
    return queries.JobFilter(
        statuses=params.status,
        kind=params.kind,
        model=params.model,
        family=params.family,
        dataset=params.dataset,
        tags=params.tag,
        q=params.q,
        study=params.study,
        owner=_owner(params.owner, caller),
        where=params.conditions(),
    )


def _owner(asked: uuid.UUID | str | None, caller: Caller) -> uuid.UUID | None:
    """The owner the list keeps to: the one asked for (`me`: the caller), else any the
    caller may read; 403 for another's when reads keep to their owner."""
    if asked == "me":
        if caller.owner is None:
            raise InvalidError("owner=me needs an API key; auth is off", field=("query", "owner"))
        asked = caller.owner
    reads_of = caller.reads_of
    if reads_of is not None and asked is not None and asked != reads_of:
        raise NotOwnedError(
            "this API key reads only its own jobs (READS_OWNER_ONLY); ask for owner=me or "
            "leave owner out"
        )
    return reads_of if asked is None else uuid.UUID(str(asked))


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
    released = studies.release_after(session=session, job_id=job_id)
    session.commit()
    enqueue_committed(released, settings=settings)  # a cancelled study job makes room
    return JobOut.of(job)


@router.post(
    "/{job_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Retry a failed or cancelled job",
    responses=responses(401, 403, 404, 409, 422),
)
def retry_job(
    job_id: uuid.UUID, session: SessionDep, settings: SettingsDep, caller: TrainCaller
) -> RetryOut:
    """Queue the job again; it resumes from its last verified checkpoint on the same step
    axis (its metrics continue), or starts over when it has none, as the answer says. A
    study's job takes its turn within the study's `max_parallel`.

    409 unless it failed or was cancelled; only its owner or an admin key may (403)."""
    retried = jobs.retry(session=session, settings=settings, job_id=job_id, caller=caller)
    message = retried.message
    goes = studies.takes_turn(session=session, job=retried.job)
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
    # Objects go before the rows commit: an unreachable store is a 503 that keeps both.
    artifacts.delete_job_objects(settings, job_id)
    session.commit()  # the rows go first: a failed commit leaves the local files in place
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
        found = queries.metric_series(
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
