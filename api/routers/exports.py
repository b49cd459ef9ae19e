"""Downloads of checkpoints, and a registered version's exports: make, list, read, download.

An export (ONNX, TorchScript, torch.export) is made in a process of its own
(`training.exporter`), which the request's worker thread waits for: the event loop, the
zoo's counts and the API's memory never wait for or hold it (ResNet-20 takes seconds,
ResNet-1202 minutes). It is kept only when its probabilities are within
`training.export.TOLERANCE` of the eager net's; an int8 graph (onnx_int8) only when its
error on the evaluation split is within the request's bound of the float graph's.
"""

from __future__ import annotations

import uuid
from typing import Annotated, ClassVar

from fastapi import APIRouter, Body, Path, Response, status
from fastapi.responses import StreamingResponse

from api.deps import ReadCaller, SessionDep, SettingsDep, TrainCaller, Version
from api.downloads import file_responses, opened, streamed
from api.errors import (
    STORE_UNAVAILABLE,
    ApiError,
    ServerFaultError,
    StoreDownError,
    responses,
)
from api.schemas import API_PREFIX, ErrorOut, ExportFormat, ExportIn, ExportOut
from core import artifacts, exports, jobs, model_registry
from core.db.tables import ModelExport
from core.errors import ConflictError, InvalidError, NotFoundError
from core.storage import StoreUnavailableError
from training import export, exporter, quantize
from training.checkpoints import CheckpointError

router = APIRouter(prefix="/registry", tags=["registry"])
job_files = APIRouter(prefix="/jobs", tags=["jobs"])

Which = Annotated[
    str, Path(pattern=r"^(best|last|\d{1,9})$", description="best, last or a step number.")
]
EXPORT_RETRY_AFTER_S = 10  # ResNet-20's export takes a few seconds


class ExportsBusyError(ApiError):
    """The key has as many exports being made as it may; the client retries later."""

    status = 429
    headers: ClassVar[dict[str, str]] = {"Retry-After": str(EXPORT_RETRY_AFTER_S)}

    def __init__(self, message: str) -> None:
        super().__init__(message, code="too_many_requests")


@job_files.get(
    "/{job_id}/checkpoints/{which}/file",
    summary="Download one of a job's checkpoints",
    response_class=StreamingResponse,
    responses={**file_responses("The checkpoint"), **responses(401, 403, 404, 409, 422, 503)},
)
def download_job_checkpoint(
    job_id: uuid.UUID, which: Which, session: SessionDep, settings: SettingsDep, caller: ReadCaller
) -> StreamingResponse:
    """The best, last or step-N checkpoint, streamed once its bytes match the recorded
    sha256 (409 if they no longer do)."""
    jobs.get(session=session, job_id=job_id, caller=caller)
    row = artifacts.find_checkpoint(session=session, job_id=job_id, which=which)
    if row is None:
        raise NotFoundError(
            f"job {job_id} has no {'step ' if which.isdigit() else ''}{which} checkpoint; "
            f"GET /jobs/{job_id}/checkpoints lists those it keeps"
        )
    handle = opened(settings, row.path, row.sha256, f"the step-{row.step} checkpoint")
    return streamed(handle, sha256=row.sha256, filename=f"job-{job_id}-step-{row.step}.pt")


@router.get(
    "/{name}/versions/{version}/checkpoint",
    summary="Download a version's checkpoint",
    response_class=StreamingResponse,
    responses={**file_responses("The checkpoint"), **responses(401, 403, 404, 409, 422, 503)},
)
def download_version_checkpoint(
    name: str, version: Version, session: SessionDep, settings: SettingsDep, caller: ReadCaller
) -> StreamingResponse:
    """The checkpoint the version serves, streamed once its bytes match its sha256."""
    row = model_registry.get_version(session=session, name=name, version=version, caller=caller)
    handle = opened(settings, row.path, row.sha256, f"the checkpoint of {name}/{version}")
    return streamed(handle, sha256=row.sha256, filename=f"{name}-v{version}-step-{row.step}.pt")


@router.post(
    "/{name}/versions/{version}/exports",
    status_code=status.HTTP_201_CREATED,
    summary="Export a version (ONNX, TorchScript, torch.export, int8 ONNX)",
    responses={
        200: {"model": ExportOut, "description": "The export made earlier, as it is"},
        **responses(401, 403, 404, 409, 422, 500, 503),
        429: {"model": ErrorOut, "description": "too_many_requests (with Retry-After)"},
    },
)
def create_export(
    name: str,
    version: Version,
    body: Annotated[ExportIn, Body()],
    session: SessionDep,
    settings: SettingsDep,
    caller: TrainCaller,
    response: Response,
) -> ExportOut:
    """Write the served net in the format, check its probabilities against the eager net's
    (8 seeded images; bound 1e-4), then store it (201); one made earlier is answered as is
    (200). 500 with the difference when over the bound: nothing is kept.

    onnx_int8 quantizes the onnx graph (static, QDQ, per-channel int8 weights), its ranges
    calibrated on `calibration_images` of the run's training split, and keeps it only when
    its error on the evaluation split is at most `max_error_increase_pp` over the float
    graph's (422 with both errors otherwise; 409 when the run's data cannot be read).

    One export of a version is made at a time: a request for one being made waits for it.
    A key makes `EXPORTS_PER_KEY` at once (429 with Retry-After beyond). Only the model's
    owner (or an admin key) exports its versions (403)."""
    try:
        row, made = exports.create(
            session=session,
            settings=settings,
            name=name,
            version=version,
            fmt=body.format,
            caller=caller,
            int8=_int8_options(body),
        )
    except (export.ExportMismatchError, exporter.ExportFailedError) as error:
        raise ServerFaultError(str(error)) from error
    except quantize.Int8OverBoundError as error:
        raise InvalidError(f"{name}/{version}: {error}") from error
    except quantize.QuantizationDataError as error:
        raise ConflictError(f"{name}/{version} cannot be quantized: {error}") from error
    except exports.ExportsBusyError as error:
        raise ExportsBusyError(str(error)) from error
    except StoreUnavailableError as error:
        raise StoreDownError(f"{STORE_UNAVAILABLE} (nothing was exported)") from error
    except CheckpointError as error:
        raise ConflictError(f"{name}/{version} cannot be exported: {error}") from error
    if not made:
        response.status_code = status.HTTP_200_OK
    return _export_out(name, version, row)


@router.get(
    "/{name}/versions/{version}/exports",
    summary="A version's exports",
    responses=responses(401, 403, 404, 422),
)
def list_exports(
    name: str, version: Version, session: SessionDep, caller: ReadCaller
) -> list[ExportOut]:
    """The formats made so far, each with its sha256, size and check."""
    row = model_registry.get_version(session=session, name=name, version=version, caller=caller)
    return [
        _export_out(name, version, found)
        for found in exports.listed(session=session, version_id=row.id)
    ]


@router.get(
    "/{name}/versions/{version}/exports/{fmt}",
    summary="A version's export in one format",
    responses=responses(401, 403, 404, 422),
)
def read_export(
    name: str, version: Version, fmt: ExportFormat, session: SessionDep, caller: ReadCaller
) -> ExportOut:
    """Its sha256, size, check (max |p_export - p_eager| and the bound) and details."""
    _, row = exports.get(session=session, name=name, version=version, fmt=fmt, caller=caller)
    return _export_out(name, version, row)


@router.get(
    "/{name}/versions/{version}/exports/{fmt}/file",
    summary="Download a version's export",
    response_class=StreamingResponse,
    responses={**file_responses("The export"), **responses(401, 403, 404, 409, 422, 503)},
)
def download_export(
    name: str,
    version: Version,
    fmt: ExportFormat,
    session: SessionDep,
    settings: SettingsDep,
    caller: ReadCaller,
) -> StreamingResponse:
    """The export's file, streamed once its bytes match the recorded sha256 (409 if not)."""
    _, row = exports.get(session=session, name=name, version=version, fmt=fmt, caller=caller)
    handle = opened(settings, row.path, row.sha256, f"the {fmt} export of {name}/{version}")
    filename = f"{name}-v{version}{export.SUFFIXES[fmt]}"
    return streamed(handle, sha256=row.sha256, filename=filename)


def _int8_options(body: ExportIn) -> quantize.Int8Options | None:
    """The request's calibration and bound of an int8 graph (defaults where not sent)."""
    if body.format != "onnx_int8":
        return None
    defaults = quantize.Int8Options()
    return quantize.Int8Options(
        calibration_images=body.calibration_images or defaults.calibration_images,
        bound_pp=(
            defaults.bound_pp if body.max_error_increase_pp is None else body.max_error_increase_pp
        ),
        eval_limit=body.eval_limit,
    )


def _export_out(name: str, version: int, row: ModelExport) -> ExportOut:
    """An export row, with where to download it."""
    file = f"{API_PREFIX}{router.prefix}/{name}/versions/{version}/exports/{row.format}/file"
    return ExportOut.model_validate(
        {
            "model": name,
            "version": version,
            "format": row.format,
            "sha256": row.sha256,
            "bytes": row.bytes,
            "max_abs_diff": row.max_abs_diff,
            "tolerance": row.tolerance,
            "details": row.details,
            "file": file,
            "owner": row.owner_key_id,
            "created_at": row.created_at,
        }
    )
