"""A job's result files (a predict job's predictions and confusion matrix): list, download.

A run lists the files it wrote in its summary's `artifacts` (name, bytes, sha256); they
live in the artifact store under `jobs/<job id>/<name>`. A download is verified against
the recorded sha256 before it is sent, and carries it in `X-Checksum-Sha256`. Checkpoints
have their own route (`/jobs/{id}/checkpoints`).
"""

from __future__ import annotations

import uuid
from pathlib import PurePosixPath
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse

from api.deps import ReadCaller, SessionDep, SettingsDep
from api.errors import STORE_UNAVAILABLE, StoreDownError, responses
from api.schemas import ArtifactOut
from core import artifacts, jobs
from core.db.tables import Job
from core.errors import ConflictError, NotFoundError
from core.storage import ObjectCorruptError, ObjectMissingError, StoreUnavailableError

router = APIRouter(prefix="/jobs", tags=["jobs"])

CHECKSUM_HEADER = "X-Checksum-Sha256"
MEDIA_TYPES = {".csv": "text/csv", ".jsonl": "application/x-ndjson", ".json": "application/json"}


@router.get(
    "/{job_id}/artifacts",
    summary="A job's result files",
    responses=responses(401, 403, 404, 422),
)
def list_artifacts(job_id: uuid.UUID, session: SessionDep, caller: ReadCaller) -> list[ArtifactOut]:
    """The files the job's run wrote (a predict job's predictions), with bytes and sha256."""
    return listed(jobs.get(session=session, job_id=job_id, caller=caller))


@router.get(
    "/{job_id}/artifacts/{name}",
    summary="Download one of a job's result files",
    response_class=FileResponse,
    responses={
        200: {"description": f"The file's bytes; its sha256 in `{CHECKSUM_HEADER}`."},
        **responses(401, 403, 404, 409, 422, 503),
    },
)
def download_artifact(
    job_id: uuid.UUID, name: str, session: SessionDep, settings: SettingsDep, caller: ReadCaller
) -> FileResponse:
    """The file, verified against the sha256 its run recorded (409 if it no longer matches)."""
    job = jobs.get(session=session, job_id=job_id, caller=caller)
    entry = _entry(job, name)
    try:
        path = artifacts.job_file(settings, job_id, entry.name, entry.sha256)
    except ObjectMissingError as error:
        raise NotFoundError(f"artifact {name!r} of job {job_id} is gone from the store") from error
    except ObjectCorruptError as error:
        raise ConflictError(f"artifact {name!r} of job {job_id} is damaged: {error}") from error
    except StoreUnavailableError as error:
        raise StoreDownError(STORE_UNAVAILABLE) from error
    return FileResponse(
        path,  # a fetched object's cache file is named by its sha256: the type is the name's
        media_type=MEDIA_TYPES.get(PurePosixPath(name).suffix, "application/octet-stream"),
        filename=name,
        headers={CHECKSUM_HEADER: entry.sha256},
    )


def listed(job: Job) -> list[ArtifactOut]:
    """The files a job's summary lists (none before it ends, or for a kind that writes none)."""
    found: Any = (job.summary or {}).get("artifacts") or []
    return [ArtifactOut.model_validate(entry) for entry in found]


def _entry(job: Job, name: str) -> ArtifactOut:
    """The listed file called `name`, or 404 naming those there are."""
    found = listed(job)
    for entry in found:
        if entry.name == name:
            return entry
    there = ", ".join(entry.name for entry in found) or "none"
    raise NotFoundError(f"job {job.id} has no artifact {name!r}; it has: {there}")
