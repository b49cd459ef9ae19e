"""What a job's dataset reads: its path resolved in the data dir, checked against uploads.

Every kind that reads a dataset checks it here on submission. An ImageFolder's path is
resolved as the run will read it (normalised, against `DATA_DIR`, links followed), so every
spelling of one place is that place. A path that is or holds the uploads folder is refused
for every caller: it would read every owner's uploads as its classes. A path inside an
upload (`uploads/<sha256>`, its subfolders, a link to it) needs a caller that may read that
upload (with `READS_OWNER_ONLY`, its owner or an admin key).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from core import uploads
from core.db.tables import Upload
from core.errors import InvalidError
from core.owners import Caller
from core.settings import Settings
from training.datasets.imagefolder import resolve_inside
from training.specs import DatasetSpec, ImageFolderSpec

FIELD = ("body", "dataset", "path")
UPLOAD_ID = re.compile(r"[0-9a-f]{64}")


def resolve(settings: Settings, dataset: ImageFolderSpec) -> Path:
    """The place an ImageFolder dataset names in `DATA_DIR`, links followed; `InvalidError`
    when it resolves outside the data dir."""
    try:
        return resolve_inside(settings.data_dir, dataset.path)
    except ValueError:
        raise InvalidError(
            f"dataset.path {dataset.path!r} resolves outside the data dir", field=FIELD
        ) from None


def check_dataset(
    session: Session, settings: Settings, dataset: DatasetSpec, caller: Caller
) -> None:
    """`InvalidError` when an ImageFolder dataset reaches the uploads folder whole, or an
    upload the caller may not read (or that does not exist)."""
    if not isinstance(dataset, ImageFolderSpec):
        return
    place = resolve(settings, dataset)
    folder = uploads.folder(settings).resolve()
    if _below(folder, place) is not None:
        raise InvalidError(
            f"dataset.path {dataset.path!r} is or holds the uploads folder, which would read "
            f"every upload as a class; name one upload: {uploads.FOLDER}/<sha256>",
            field=FIELD,
        )
    inside = _below(place, folder)
    if inside is not None:
        _check_upload(session, inside[0].lower(), dataset, caller)  # () was refused above


def _check_upload(session: Session, name: str, dataset: ImageFolderSpec, caller: Caller) -> None:
    """`InvalidError` unless `name` is an upload (a folder of `uploads/`) the caller reads."""
    missing = InvalidError(
        f"dataset.path {dataset.path!r} names an upload that does not exist; upload an "
        "archive with POST /api/v1/datasets and use the path it answers",
        field=FIELD,
    )
    if UPLOAD_ID.fullmatch(name) is None:
        raise missing
    owners = session.scalars(select(Upload.owner_key_id).where(Upload.sha256 == name))
    if not any(caller.sees(owner) for owner in owners):
        raise missing


def _below(place: Path, folder: Path) -> tuple[str, ...] | None:
    """The parts of `place` below `folder` (`()`: it is `folder`); None when outside it.
    A folder is compared as the file system sees it (`samefile`), so a case-insensitive
    one's other spellings are the same folder."""
    for depth, parent in enumerate((place, *place.parents)):
        if _same(parent, folder):
            return place.parts[len(place.parts) - depth :]
    return None


def _same(one: Path, other: Path) -> bool:
    return one == other or (one.exists() and other.exists() and os.path.samefile(one, other))
