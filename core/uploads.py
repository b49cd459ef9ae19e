"""Dataset uploads: ImageFolder archives unpacked under `DATA_DIR/uploads/<sha256>/`.

An upload's id is its archive's sha256 (the same archive uploaded twice is one upload).
Unpacking is bounded per archive (`UPLOAD_MAX_UNPACKED_BYTES`, `UPLOAD_MAX_RATIO`) and per
owner (`UPLOAD_QUOTA_BYTES`: the unpacked bytes an owner keeps). An upload a queued or
running job reads cannot be deleted.
"""

from __future__ import annotations

import re
import shutil
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db.tables import Job
from core.errors import ConflictError, InvalidError, NotFoundError
from core.settings import Settings
from training.datasets.archives import Limits, unpack_archive

FOLDER = "uploads"  # under DATA_DIR
_ID = re.compile(r"[0-9a-f]{64}")
ACTIVE = ("queued", "running")


@dataclass(frozen=True)
class Upload:
    """An unpacked upload: its id, its dataset path (relative to DATA_DIR) and its size."""

    id: str
    path: str
    files: int
    bytes: int
    created_at: datetime


def folder(settings: Settings) -> Path:
    """Where uploads are unpacked."""
    return settings.data_dir / FOLDER


def describe(settings: Settings, tree: Path) -> Upload:
    """An unpacked upload's row, read from its folder."""
    files = [path for path in tree.rglob("*") if path.is_file()]
    return Upload(
        id=tree.name,
        path=tree.relative_to(settings.data_dir).as_posix(),
        files=len(files),
        bytes=sum(path.stat().st_size for path in files),
        created_at=datetime.fromtimestamp(tree.stat().st_mtime, UTC),
    )


def list_all(settings: Settings) -> list[Upload]:
    """Every unpacked upload, newest first (half-written ones are not uploads)."""
    root = folder(settings)
    if not root.is_dir():
        return []
    trees = [tree for tree in root.iterdir() if tree.is_dir() and _ID.fullmatch(tree.name)]
    uploads = [describe(settings, tree) for tree in trees]
    return sorted(uploads, key=lambda upload: upload.created_at, reverse=True)


def usage(settings: Settings, owner: uuid.UUID | None) -> int:
    """The unpacked bytes `owner` keeps in uploads (None: the anonymous owner)."""
    # Uploads record no owner yet: every upload counts against the one quota of whoever
    # asks. Once uploads have an owner, sum only `owner`'s here.
    del owner
    return sum(upload.bytes for upload in list_all(settings))


def store(archive: Path, *, settings: Settings, owner: uuid.UUID | None) -> Upload:
    """Unpack an uploaded archive within the limits and `owner`'s quota; its upload.

    Over a limit: `ArchiveLimitError` (from `training.datasets.archives`), nothing kept.
    No images: `InvalidError`, nothing kept.
    """
    limits = Limits(
        max_bytes=settings.upload_max_unpacked_bytes,
        max_ratio=settings.upload_max_ratio,
        room=settings.upload_quota_bytes - usage(settings, owner),
    )
    tree = unpack_archive(archive, folder(settings), limits=limits)
    upload = describe(settings, tree)
    if upload.files == 0:
        shutil.rmtree(tree)
        raise InvalidError(
            "the archive holds no images (expected class/image files)", field=("body", "file")
        )
    return upload


def users(*, session: Session, settings: Settings, upload_id: str) -> list[uuid.UUID]:
    """The queued and running jobs whose dataset lies in the upload."""
    tree = (folder(settings) / upload_id).resolve()
    rows = session.execute(select(Job.id, Job.spec).where(Job.status.in_(ACTIVE))).all()
    return [job_id for job_id, spec in rows if _reads(spec, settings.data_dir, tree)]


def _reads(spec: dict[str, Any], data_dir: Path, tree: Path) -> bool:
    """Whether a job spec's dataset is a path inside `tree`."""
    dataset = spec.get("dataset") or {}
    path = dataset.get("path") if isinstance(dataset, dict) else None
    return isinstance(path, str) and (data_dir.resolve() / path).resolve().is_relative_to(tree)


def delete(*, session: Session, settings: Settings, upload_id: str) -> None:
    """Remove an upload's files, unless a queued or running job reads them."""
    if not _ID.fullmatch(upload_id):
        raise InvalidError(
            f"{upload_id!r} is not an upload id (the 64 hex digits of its sha256)",
            field=("path", "upload_id"),
        )
    tree = folder(settings) / upload_id
    if not tree.is_dir():
        raise NotFoundError(f"upload {upload_id} does not exist")
    active = users(session=session, settings=settings, upload_id=upload_id)
    if active:
        named = ", ".join(str(job_id) for job_id in active[:5])
        raise ConflictError(
            f"upload {upload_id} is the dataset of {len(active)} queued or running job(s) "
            f"({named}); cancel them or wait until they end, then delete it"
        )
    shutil.rmtree(tree)
