"""Where every artifact lives: the object keys of jobs, their exports, and uploads.

A key is a relative POSIX path (`core.storage.check_key`); the store keeps an object under
it (`core.storage`). The layout:

    jobs/<job id>/spec.json, summary.json, metrics.jsonl, predictions.csv, ...
    jobs/<job id>/checkpoints/step-<N>.pt, best.pt
    jobs/<job id>/exports/<version row id>/model.onnx | model.torchscript.pt | model.pt2
    uploads/<sha256>/archive.zip | archive.tar
    payloads/models/<name>/<version>/<segment>.jsonl.gz   (logged predictions of a version)
    payloads/jobs/<job id>/<segment>.jsonl.gz             (of a job id reference)

A worker writes a job's files into the same layout under `ARTIFACT_DIR` (`job_dir`), and an
upload is unpacked under `DATA_DIR` at its dataset path (`upload_path`).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from training import checkpoints

JOBS = "jobs"
EXPORTS = "exports"  # a job's exports' folder, beside its checkpoints
UPLOADS = "uploads"
PAYLOADS = "payloads"
EXPORT_NAME = "model"  # an export's file name, before its format's suffix


def job_prefix(job_id: uuid.UUID) -> str:
    """The key prefix of a job's artifacts."""
    return f"{JOBS}/{job_id}/"


def job_file_key(job_id: uuid.UUID, name: str) -> str:
    """The key of one of a job's result files (`predictions.csv`)."""
    return f"{job_prefix(job_id)}{name}"


def checkpoints_prefix(job_id: uuid.UUID) -> str:
    """The key prefix of a job's checkpoint files."""
    return f"{job_prefix(job_id)}{checkpoints.DIRECTORY}/"


def checkpoint_key(job_id: uuid.UUID, name: str) -> str:
    """The key of one of a job's checkpoint files (`step-100.pt`)."""
    return f"{checkpoints_prefix(job_id)}{name}"


def export_prefix(job_id: uuid.UUID, version_id: int) -> str:
    """The key prefix of one registered version's exports."""
    return f"{job_prefix(job_id)}{EXPORTS}/{version_id}/"


def export_key(job_id: uuid.UUID, version_id: int, suffix: str) -> str:
    """The key of a version's export in the format of file suffix `suffix` (`.onnx`)."""
    return f"{export_prefix(job_id, version_id)}{EXPORT_NAME}{suffix}"


def is_job_key(key: str) -> bool:
    """Whether `key` lies among the jobs' artifacts (the only objects readers open)."""
    return key.startswith(f"{JOBS}/")


def is_export_key(key: str) -> bool:
    """Whether `key` is a file of an export (`jobs/<id>/exports/...`)."""
    parts = key.split("/")
    return len(parts) > 3 and parts[0] == JOBS and parts[2] == EXPORTS


def job_dir(root: Path, job_id: uuid.UUID) -> Path:
    """Where a job's files lie under the artifact folder `root`."""
    return root / JOBS / str(job_id)


def upload_path(upload_id: str) -> str:
    """An upload's dataset path, relative to `DATA_DIR` (a job's `dataset.path`)."""
    return f"{UPLOADS}/{upload_id}"


def upload_prefix(upload_id: str) -> str:
    """The key prefix of an upload's objects."""
    return f"{upload_path(upload_id)}/"


def archive_key(upload_id: str, archive_name: str) -> str:
    """The key of an upload's archive (a zip, or a tar of any compression), by the name of
    the file it was sent as."""
    kind = "zip" if archive_name.lower().endswith(".zip") else "tar"
    return f"{upload_prefix(upload_id)}archive.{kind}"


def payload_prefix(name: str, version: int) -> str:
    """The key prefix of the payload segments logged for a registered version."""
    return f"{PAYLOADS}/models/{name}/{version}/"


def job_payload_prefix(job_id: uuid.UUID) -> str:
    """The key prefix of the payload segments logged for a job served by its id."""
    return f"{PAYLOADS}/jobs/{job_id}/"


def payload_key(prefix: str, segment: str) -> str:
    """The key of one payload segment (a payload prefix and the segment's file name)."""
    return f"{prefix}{segment}"
