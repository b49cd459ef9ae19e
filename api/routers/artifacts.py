"""A job's result files (a predict job's predictions and confusion matrix): list, download.

A run lists the files it wrote in its summary's `artifacts` (name, bytes, sha256); they
live in the artifact store under `jobs/<job id>/<name>`. A download is sent as the other
stored files are (`api.downloads`): verified against the recorded sha256 first, which it
carries in `X-Checksum-Sha256`. Checkpoints have their own routes (`/jobs/{id}/checkpoints`).
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from api.deps import ReadCaller, SessionDep, SettingsDep
from api.downloads import file_responses, opened, streamed
from api.errors import responses
from api.schemas import ArtifactOut
from core import jobs, layout
from core.db.tables import Job
from core.errors import NotFoundError

router = APIRouter(prefix="/jobs", tags=["jobs"])


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
    response_class=StreamingResponse,
    responses={**file_responses("The file"), **responses(401, 403, 404, 409, 422, 503)},
)
def download_artifact(
    job_id: uuid.UUID, name: str, session: SessionDep, settings: SettingsDep, caller: ReadCaller
) -> StreamingResponse:
    """The file, streamed once its bytes match the sha256 its run recorded (409 if they no
    longer do)."""
    job = jobs.get(session=session, job_id=job_id, caller=caller)
    entry = _entry(job, name)
    key = layout.job_file_key(job_id, entry.name)
    handle = opened(settings, key, entry.sha256, f"{entry.name} of job {job_id}")
    return streamed(handle, sha256=entry.sha256, filename=entry.name)


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
