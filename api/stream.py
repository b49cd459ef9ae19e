"""A job's live event stream (Server-Sent Events), polling the database off the event loop.

Events: `log` (a log line; its SSE id is the line's id, so `Last-Event-ID` resumes after
it), `metrics` (new points as series), `progress` (step / total), `status` (status,
attempt, cancel flag, error) and a final `end` when the job is over. A stream that reaches
its maximum life (STREAM_MAX_SECONDS) ends without `end`: the client reconnects.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator

import anyio
from fastapi.sse import format_sse_event
from starlette.concurrency import run_in_threadpool

from api.schemas import JobState, LogLine, MetricsOut, Series
from core import job_queries
from core.db.session import session_scope
from core.db.tables import FINAL_STATUSES

KEEPALIVE_SECONDS = 15.0


async def job_events(
    url: str,
    job_id: uuid.UUID,
    *,
    poll_seconds: float,
    last_event_id: int,
    since_step: int | None,
    max_seconds: float = math.inf,
) -> AsyncIterator[bytes]:
    """SSE bytes for job `job_id` until it ends, or for `max_seconds` (the client resumes
    with Last-Event-ID and since_step); metric points from `since_step` on."""
    if since_step is None:  # by default, only points written from now on
        since_step = await run_in_threadpool(_latest_step, url, job_id) + 1
    cursor = job_queries.TailCursor(last_event_id, since_step)
    previous: JobState | None = None
    quiet_since = time.monotonic()
    deadline = quiet_since + max_seconds
    while time.monotonic() < deadline:
        tail = await run_in_threadpool(_tail, url, job_id, cursor)
        state = None if tail.state is None else JobState.model_validate(tail.state)
        chunks = _encode(tail, state, previous)
        if chunks:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
            chunks, quiet_since = [b": keep-alive\n\n"], time.monotonic()
        for chunk in chunks:
            yield chunk
        if _ended(tail, state):
            yield _end(state)
            return
        previous, cursor = state, tail.cursor
        if not tail.more:
            await anyio.sleep(poll_seconds)


def _latest_step(url: str, job_id: uuid.UUID) -> int:
    with session_scope(url) as session:
        return job_queries.latest_step(session=session, job_id=job_id)


def _tail(url: str, job_id: uuid.UUID, cursor: job_queries.TailCursor) -> job_queries.Tail:
    with session_scope(url) as session:
        return job_queries.tail(session=session, job_id=job_id, cursor=cursor)


def _ended(tail: job_queries.Tail, state: JobState | None) -> bool:
    """Whether the job is gone or over, with nothing left to send."""
    return state is None or (state.status in FINAL_STATUSES and not tail.more)


def _encode(
    tail: job_queries.Tail, state: JobState | None, previous: JobState | None
) -> list[bytes]:
    """The SSE events for what a poll found: log lines, points, then state changes."""
    lines = [LogLine.of(event) for event in tail.lines]
    chunks = [
        format_sse_event(data_str=line.model_dump_json(), event="log", id=str(line.id))
        for line in lines
    ]
    if tail.points:
        chunks.append(format_sse_event(data_str=_series(tail.points), event="metrics"))
    if state is None:
        return chunks
    fields = ("status", "attempt", "cancel_requested", "error")
    if previous is None or any(getattr(state, f) != getattr(previous, f) for f in fields):
        chunks.append(format_sse_event(data_str=state.model_dump_json(), event="status"))
    if previous is None or (state.step, state.total_steps) != (previous.step, previous.total_steps):
        chunks.append(format_sse_event(data_str=state.model_dump_json(), event="progress"))
    return chunks


def _series(points: list[tuple[str, int, float]]) -> str:
    """Points as `{"series": {name: {"steps": [...], "values": [...]}}}`."""
    series: dict[str, Series] = {}
    for name, step, value in points:
        entry = series.setdefault(name, Series(steps=[], values=[]))
        entry.steps.append(step)
        entry.values.append(value)
    return MetricsOut(series=series).model_dump_json()


def _end(state: JobState | None) -> bytes:
    """The last event: how the job ended (status null when it was deleted meanwhile)."""
    if state is None:
        payload = '{"status": null, "error": "the job was deleted"}'
    else:
        payload = state.model_dump_json(include={"status", "error"})
    return format_sse_event(data_str=payload, event="end")
