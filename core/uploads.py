"""Dataset uploads: ImageFolder archives unpacked under `DATA_DIR/uploads/<sha256>/`.

An upload's id is its archive's sha256. The files are kept once per archive; each owner
(API key, or none with auth off) that sent it has a row (`core.db.tables.Upload`) with
the disk bytes (whole blocks, folders included) and files its quotas
(`UPLOAD_QUOTA_BYTES`, `UPLOAD_QUOTA_FILES`) count. Unpacking is bounded per archive
(`UPLOAD_MAX_UNPACKED_BYTES`, `UPLOAD_MAX_RATIO`) and by the room the owner has left. The
temporaries of an upload are held while in use; those of a killed process are swept when
the API starts and before each upload. An upload a queued or running job reads cannot be
deleted; its files go with its last row.

With an object store (`ARTIFACT_STORE=s3`) the archive itself is shared through the bucket,
as `uploads/<sha256>/archive.zip` (or `.tar`, `core.layout`), its sha256 the upload's id: a
worker that lacks `DATA_DIR/uploads/<sha256>/` fetches, verifies and unpacks it before the
job reads it (`materialize`). Deleting the upload deletes its objects. The local store
shares nothing: its machine's unpacked files are all there is.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from core import layout, listing
from core.db.session import take_turns
from core.db.tables import ACTIVE_STATUSES, Job
from core.db.tables import Upload as Row
from core.errors import ConflictError, InvalidError, NotFoundError
from core.owners import Caller, check_owner
from core.settings import Settings
from core.storage import ObjectMissingError, StoreError, store_for
from training.datasets.archives import (
    FETCHING,
    ArchiveLimitError,
    Limits,
    sha256_of,
    sweep,
    temporary,
    unpack_archive,
)

FOLDER = layout.UPLOADS  # under DATA_DIR
_ID = re.compile(r"[0-9a-f]{64}")


def folder(settings: Settings) -> Path:
    """Where uploads are unpacked."""
    return settings.data_dir / FOLDER


def sweep_temporaries(settings: Settings) -> list[str]:
    """Remove what uploads killed mid-way left in the uploads folder (archives, partial
    unpacks); the names removed."""
    return sweep(folder(settings))


def path_of(upload_id: str) -> str:
    """An upload's dataset path, relative to DATA_DIR (a job's `dataset.path`)."""
    return layout.upload_path(upload_id)


def _owned_by(owner: uuid.UUID | None) -> ColumnElement[bool]:
    return Row.owner_key_id.is_(None) if owner is None else Row.owner_key_id == owner


def usage(*, session: Session, owner: uuid.UUID | None) -> tuple[int, int]:
    """The disk bytes and files of the uploads `owner` keeps (None: the owner of auth-off
    uploads)."""
    totals = select(func.coalesce(func.sum(Row.bytes), 0), func.coalesce(func.sum(Row.files), 0))
    disk, files = session.execute(totals.where(_owned_by(owner))).one()
    return int(disk), int(files)


def on_disk(tree: Path) -> tuple[int, int]:
    """The bytes the disk holds for `tree` (its files' and folders' blocks) and its files."""
    disk, files = tree.lstat().st_blocks * 512, 0
    for path in tree.rglob("*"):
        disk += path.lstat().st_blocks * 512
        files += path.is_file()
    return disk, files


def store(archive: Path, *, session: Session, settings: Settings, owner: uuid.UUID | None) -> Row:
    """Unpack an uploaded archive within the limits and `owner`'s quota; its row (flushed).

    Over a limit: `ArchiveLimitError` (from `training.datasets.archives`), nothing kept.
    No images: `InvalidError`, nothing kept. An archive `owner` sent before is its row.
    """
    upload_id = sha256_of(archive)
    kept = session.scalars(select(Row).where(Row.sha256 == upload_id, _owned_by(owner))).first()
    if kept is not None and (folder(settings) / upload_id).is_dir():
        return kept
    # One upload of an owner at a time counts its room: two at once cannot both fit in it.
    take_turns(session, f"upload quota {owner}")
    used, used_files = usage(session=session, owner=owner)
    limits = Limits(
        max_bytes=settings.upload_max_unpacked_bytes,
        max_ratio=settings.upload_max_ratio,
        room=settings.upload_quota_bytes - used,
        room_files=settings.upload_quota_files - used_files,
        block=_block_size(folder(settings)),
    )
    tree = unpack_archive(archive, folder(settings), limits=limits)
    disk, files = on_disk(tree)
    if not files:
        _drop_unkept(session, upload_id, tree)
        raise InvalidError(
            "the archive holds no images (expected class/image files)", field=("body", "file")
        )
    # Unpacked before (by another owner) or on a file system of larger blocks: the checks
    # while unpacking estimated; what the disk holds is what counts.
    try:
        _check_quota(disk, files, limits)
    except ArchiveLimitError:
        _drop_unkept(session, upload_id, tree)
        raise
    # Before the row: no row names an archive the store lacks.
    put_archive(archive, upload_id, tree, session=session, settings=settings)
    row = kept or Row(sha256=upload_id, owner_key_id=owner)
    row.files, row.bytes = files, disk
    session.add(row)
    session.flush()
    return row


def _block_size(path: Path) -> int:
    """The block size of the file system `path` is on (4096 if it does not exist yet)."""
    return os.statvfs(path).f_frsize if path.is_dir() else 4096


def _check_quota(disk: int, files: int, limits: Limits) -> None:
    """Refuse a tree past the disk bytes or files the owner's quota has left."""
    if limits.room is not None and disk > limits.room:
        raise ArchiveLimitError(
            f"the archive takes {disk} bytes on disk, more than the {max(limits.room, 0)} "
            "bytes left of the upload quota"
        )
    if limits.room_files is not None and files > limits.room_files:
        raise ArchiveLimitError(
            f"the archive holds {files} files, more than the {max(limits.room_files, 0)} "
            "left of the upload file quota"
        )


def _drop_unkept(session: Session, upload_id: str, tree: Path) -> None:
    """Remove an unpacked tree unless a row (another owner's upload) keeps it."""
    if not session.scalar(select(func.count()).where(Row.sha256 == upload_id)):
        shutil.rmtree(tree, ignore_errors=True)


def put_archive(
    archive: Path, upload_id: str, tree: Path, *, session: Session, settings: Settings
) -> None:
    """Share the archive through the store (for workers on other machines); when it cannot
    be, nothing of it is kept here either (unless another owner's row keeps the same files)."""
    try:
        key = layout.archive_key(upload_id, archive.name)
        store_for(settings).share(key, archive, upload_id)
    except StoreError:
        _drop_unkept(session, upload_id, tree)
        raise


def visible(*, session: Session, caller: Caller) -> list[Row]:
    """The upload rows `caller` may read, newest first."""
    page = listing.page(
        session=session, query=select(Row), order=NEWEST, caller=caller, owner=Row.owner_key_id
    )
    return page.items


NEWEST = listing.newest(Row.created_at, Row.id, noun="upload", id_kind="integer")


def readers(*, session: Session, settings: Settings, upload_id: str) -> list[uuid.UUID]:
    """The queued and running jobs whose dataset lies in the upload's folder."""
    tree = (folder(settings) / upload_id).resolve()
    query = select(Job.id, Job.spec).where(Job.status.in_(ACTIVE_STATUSES))
    rows = session.execute(query).all()
    return [job_id for job_id, spec in rows if _reads(spec, settings.data_dir, tree)]


def _reads(spec: dict[str, Any], data_dir: Path, tree: Path) -> bool:
    """Whether a job spec's dataset is a path inside `tree`."""
    dataset = spec.get("dataset") or {}
    path = dataset.get("path") if isinstance(dataset, dict) else None
    return isinstance(path, str) and (data_dir.resolve() / path).resolve().is_relative_to(tree)


def delete(*, session: Session, settings: Settings, caller: Caller, upload_id: str) -> Path | None:
    """Remove the caller's row of an upload; the folder to remove once committed, if no
    row is left (a folder older than the rows has none: only an admin key removes it)."""
    if not _ID.fullmatch(upload_id):
        raise InvalidError(
            f"{upload_id!r} is not an upload id (the 64 hex digits of its archive's sha256)",
            field=("path", "upload_id"),
        )
    tree = folder(settings) / upload_id
    rows = list(session.scalars(select(Row).where(Row.sha256 == upload_id)))
    seen = [row for row in rows if caller.sees(row.owner_key_id)]
    if not seen and (rows or not tree.is_dir()):
        raise NotFoundError(f"upload {upload_id} does not exist")
    mine = [row for row in seen if caller.may_change(row.owner_key_id)]
    if not mine:
        check_owner(caller, seen[0].owner_key_id if seen else None, f"upload {upload_id}", "delete")
    active = readers(session=session, settings=settings, upload_id=upload_id)
    if active:
        named = ", ".join(str(job_id) for job_id in active[:5])
        raise ConflictError(
            f"upload {upload_id} is the dataset of {len(active)} queued or running job(s) "
            f"({named}); cancel them or wait until they end, then delete it"
        )
    for row in mine:
        session.delete(row)
    session.flush()
    return tree if len(mine) == len(rows) else None


def delete_objects(settings: Settings, upload_id: str) -> int:
    """Delete the objects the store shares of an upload (none with the local store)."""
    return store_for(settings).delete_shared(layout.upload_prefix(upload_id))


def upload_of(dataset: object) -> str | None:
    """The upload id a job's dataset spec names (`path: uploads/<sha256>...`), if any."""
    path = dataset.get("path") if isinstance(dataset, dict) else None
    parts = path.split("/") if isinstance(path, str) else []
    if len(parts) >= 2 and parts[0] == FOLDER and _ID.fullmatch(parts[1]):
        return parts[1]
    return None


def materialize(settings: Settings, dataset: object) -> Path | None:
    """Unpack the upload a job's dataset names into `DATA_DIR/uploads/`, fetched from the
    object store (and verified by its sha256), unless this machine has it already; None
    for a dataset that is no upload, or a store that shares none (the local store)."""
    upload_id = upload_of(dataset)
    if upload_id is None:
        return None
    tree = folder(settings) / upload_id
    if tree.is_dir():
        return tree
    try:
        shared = store_for(settings).fetch_shared(layout.upload_prefix(upload_id), upload_id)
    except ObjectMissingError:
        raise ObjectMissingError(f"upload {upload_id} is missing from the object store") from None
    if shared is None:
        return None
    key, fetched = shared
    with temporary(folder(settings), FETCHING, folder=True) as scratch:
        named = scratch / key.rsplit("/", 1)[1]  # unpacking reads the suffix
        named.symlink_to(fetched)
        limits = Limits(
            max_bytes=settings.upload_max_unpacked_bytes, max_ratio=settings.upload_max_ratio
        )
        return unpack_archive(named, folder(settings), limits=limits)
