"""What was served: a version's (or a job's) logged payloads and its drift statistics.

The payload log's segments are listed from the store (`serving.payloads`: an object's name
says its times, records and sha256) and downloaded as stored, verified; the drift
statistics are this API process's window (`serving.drift`). Only callers who may read the
model (or job) see either.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.responses import StreamingResponse

from api.deps import ReadCaller, SessionDep, SettingsDep, Version
from api.downloads import file_responses, opened, streamed
from api.errors import STORE_UNAVAILABLE, StoreDownError, responses
from api.schemas import (
    API_PREFIX,
    ChannelDrift,
    ClassDrift,
    DriftOut,
    DriftReference,
    DriftWindow,
    PayloadPage,
    PayloadQuery,
    PayloadSegmentOut,
)
from core import jobs, layout, model_registry
from core.errors import InvalidError, NotFoundError
from core.settings import Settings
from core.storage import StoreUnavailableError, store_for
from serving import payloads
from serving.cache import ModelCache
from serving.dataplane import DataPlane
from serving.drift import Drift, DriftMonitor
from serving.metrics import WatchMetrics
from training.data import DatasetInfo

router = APIRouter(prefix="/registry", tags=["registry"])
job_payloads = APIRouter(prefix="/jobs", tags=["jobs"])

SegmentName = Annotated[
    str,
    Path(
        pattern=f"^{payloads.SEGMENT.pattern}$",
        description="A segment's name, as its list gives it.",
    ),
]


@router.get(
    "/{name}/versions/{version}/payloads",
    summary="A version's logged payloads",
    responses=responses(401, 403, 404, 422, 503),
)
def list_version_payloads(
    name: str,
    version: Version,
    params: Annotated[PayloadQuery, Query()],
    session: SessionDep,
    settings: SettingsDep,
    caller: ReadCaller,
) -> PayloadPage:
    """The payload log's segments of the version, newest first (PAYLOAD_LOG_SAMPLE of its
    images, each a JSON line: digest, top classes, latency, time, caller)."""
    model_registry.get_version(session=session, name=name, version=version, caller=caller)
    base = f"{API_PREFIX}{router.prefix}/{name}/versions/{version}/payloads"
    return _page(settings, layout.payload_prefix(name, version), base, params)


@router.get(
    "/{name}/versions/{version}/payloads/{segment}",
    summary="Download a segment of a version's payload log",
    response_class=StreamingResponse,
    responses={**file_responses("The segment"), **responses(401, 403, 404, 409, 422, 503)},
)
def download_version_payloads(
    name: str,
    version: Version,
    segment: SegmentName,
    session: SessionDep,
    settings: SettingsDep,
    caller: ReadCaller,
) -> StreamingResponse:
    """The segment's gzip'd JSON Lines, streamed once its bytes match its sha256."""
    model_registry.get_version(session=session, name=name, version=version, caller=caller)
    prefix = layout.payload_prefix(name, version)
    return _download(settings, prefix, segment, f"{name}-v{version}")


@router.get(
    "/{name}/versions/{version}/drift",
    summary="A version's drift from its training data",
    responses=responses(401, 403, 404, 409, 422),
)
def read_version_drift(
    name: str, version: Version, request: Request, session: SessionDep, caller: ReadCaller
) -> DriftOut:
    """Per channel the served pixels' mean and std against the training split's (shift:
    |mean served - mean train| / std train), and the predicted classes against the
    reference, over this process's last DRIFT_WINDOW_IMAGES images (DRIFT_WINDOW_SECONDS)."""
    row = model_registry.get_version(session=session, name=name, version=version, caller=caller)
    drift = _monitor(request).read(f"{name}/{version}")
    return _drift_out(request.app.state.settings, drift, name, version, row.job_id)


@job_payloads.get(
    "/{job_id}/payloads",
    summary="A job's logged payloads (served by its id)",
    responses=responses(401, 403, 404, 422, 503),
)
def list_job_payloads(
    job_id: uuid.UUID,
    params: Annotated[PayloadQuery, Query()],
    session: SessionDep,
    settings: SettingsDep,
    caller: ReadCaller,
) -> PayloadPage:
    """The payload log's segments of predictions that named the job by its id, newest first
    (those through a registered version are that version's)."""
    jobs.get(session=session, job_id=job_id, caller=caller)
    base = f"{API_PREFIX}{job_payloads.prefix}/{job_id}/payloads"
    return _page(settings, layout.job_payload_prefix(job_id), base, params)


@job_payloads.get(
    "/{job_id}/payloads/{segment}",
    summary="Download a segment of a job's payload log",
    response_class=StreamingResponse,
    responses={**file_responses("The segment"), **responses(401, 403, 404, 409, 422, 503)},
)
def download_job_payloads(
    job_id: uuid.UUID,
    segment: SegmentName,
    session: SessionDep,
    settings: SettingsDep,
    caller: ReadCaller,
) -> StreamingResponse:
    """The segment's gzip'd JSON Lines, streamed once its bytes match its sha256."""
    jobs.get(session=session, job_id=job_id, caller=caller)
    return _download(settings, layout.job_payload_prefix(job_id), segment, f"job-{job_id}")


@job_payloads.get(
    "/{job_id}/drift",
    summary="A job's drift from its training data (served by its id)",
    responses=responses(401, 403, 404, 409, 422),
)
def read_job_drift(
    job_id: uuid.UUID, request: Request, session: SessionDep, caller: ReadCaller
) -> DriftOut:
    """As a version's drift, for the predictions that named the job by its id."""
    jobs.get(session=session, job_id=job_id, caller=caller)
    drift = _monitor(request).read(str(job_id))
    return _drift_out(request.app.state.settings, drift, None, None, job_id)


@asynccontextmanager
async def watching(app: FastAPI, plane: DataPlane) -> AsyncIterator[DriftMonitor]:
    """Hang the payload log and the drift monitor on the plane's taps and run their tasks
    on this loop; on the way out the buffered payloads are written (nothing is lost on a
    clean stop)."""
    settings, models = plane.settings, plane.models
    metrics: WatchMetrics = app.state.watch_metrics

    def classes(sha256: str) -> tuple[str, ...] | None:
        info = _loaded_info(models, sha256)
        return info.classes if info is not None else None

    log = payloads.PayloadLog(settings, store_for(settings), metrics, classes)
    drift = DriftMonitor(settings, metrics, lambda sha256: _loaded_info(models, sha256))
    if settings.payload_log_sample > 0:
        plane.taps.append(log.tap)
    if settings.drift_enabled:  # off: no per-batch cost; the drift routes answer 409
        plane.taps.append(drift.tap)
    tasks = [asyncio.create_task(log.run()), asyncio.create_task(drift.run())]
    try:
        yield drift
    finally:
        log.stop()
        drift.stop()
        await asyncio.gather(*tasks)


def _loaded_info(models: ModelCache, sha256: str) -> DatasetInfo | None:
    """The data of a loaded checkpoint (what it was trained on), if it is loaded."""
    served = models.peek(sha256)
    return served.info if served is not None else None


def _monitor(request: Request) -> DriftMonitor:
    monitor: DriftMonitor = request.state.drift  # the lifespan's (see api.app.Serving)
    return monitor


def _page(settings: Settings, prefix: str, base: str, params: PayloadQuery) -> PayloadPage:
    """A page of the segments under `prefix`, newest first, after the cursor's segment."""
    if params.cursor is not None and payloads.SEGMENT.fullmatch(params.cursor) is None:
        raise InvalidError(
            "cursor is not one this API gave out; pass a page's next_cursor as it came, or "
            "leave cursor out for the first page",
            field=("query", "cursor"),
        )
    try:
        found = payloads.segments(store_for(settings), prefix)[::-1]
    except StoreUnavailableError as error:
        raise StoreDownError(f"{STORE_UNAVAILABLE} (no segment was listed)") from error
    if params.cursor is not None:
        found = [segment for segment in found if segment.name < params.cursor]
    shown = found[: params.limit]
    more = len(found) > params.limit
    return PayloadPage(
        items=[_segment_out(segment, base) for segment in shown],
        next_cursor=shown[-1].name if more else None,
    )


def _segment_out(segment: payloads.Segment, base: str) -> PayloadSegmentOut:
    return PayloadSegmentOut(
        name=segment.name,
        records=segment.records,
        bytes=segment.bytes,
        first_at=segment.first,
        last_at=segment.last,
        sha256=segment.sha256,
        file=f"{base}/{segment.name}",
    )


def _download(settings: Settings, prefix: str, segment: str, what: str) -> StreamingResponse:
    """The stored segment under `prefix`, open and verified, streamed; 404 when it is not
    there (deleted by the bounds, or never written)."""
    key = layout.payload_key(prefix, segment)
    store = store_for(settings)
    try:
        stored = key in store.sizes(key)
    except StoreUnavailableError as error:
        raise StoreDownError(f"{STORE_UNAVAILABLE} (the segment was not fetched)") from error
    if not stored:
        raise NotFoundError(
            f"{what} has no payload segment {segment!r} (the oldest go beyond "
            "PAYLOAD_LOG_MAX_BYTES or PAYLOAD_LOG_MAX_AGE_DAYS); its list names those kept"
        )
    parsed = payloads.parse(key, segment, 0)
    assert parsed is not None  # the path's pattern is the segments' own
    handle = opened(settings, store.ref(key), parsed.sha256, f"payload segment {segment}")
    return streamed(handle, sha256=parsed.sha256, filename=f"{what}-{segment}")


def _time(at: float | None) -> datetime | None:
    return datetime.fromtimestamp(at, UTC) if at is not None else None


def _drift_out(
    settings: Settings,
    drift: Drift | None,
    model: str | None,
    version: int | None,
    job_id: uuid.UUID,
) -> DriftOut:
    """A window's statistics as the API answers them (an empty window when not served)."""
    window = DriftWindow(
        images=drift.images if drift is not None else 0,
        max_images=settings.drift_window_images,
        max_seconds=settings.drift_window_seconds,
        first_at=_time(drift.first) if drift is not None else None,
        last_at=_time(drift.last) if drift is not None else None,
    )
    reference = drift.reference if drift is not None else None
    channels = (
        [
            ChannelDrift(channel=index, mean=mean, std=std, shift=shift, std_ratio=ratio)
            for index, (mean, std, shift, ratio) in enumerate(
                zip(drift.served_mean, drift.served_std, drift.shift, drift.std_ratio, strict=True)
            )
        ]
        if drift is not None and reference is not None
        else []
    )
    classes = (
        ClassDrift(
            counts=drift.counts,
            total_variation=drift.total_variation,
            jensen_shannon=drift.jensen_shannon,
            p_value=drift.p_value,
        )
        if drift is not None
        and drift.total_variation is not None
        and drift.jensen_shannon is not None
        else None
    )
    return DriftOut(
        model=model,
        version=version,
        job_id=job_id,
        window=window,
        reference=DriftReference(
            mean=list(reference.mean),
            std=list(reference.std),
            classes=list(reference.classes),
            class_distribution=list(reference.distribution),
            class_source=reference.source,
        )
        if reference is not None
        else None,
        channels=channels,
        classes=classes,
    )
