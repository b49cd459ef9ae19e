"""Datasets: what can be read here, and uploads of ImageFolder archives (list, delete)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from fastapi import APIRouter, UploadFile, status

from api.deps import ReadCaller, ReadKey, SessionDep, SettingsDep, TrainCaller
from api.errors import TooLargeError, responses
from api.schemas import DatasetOut, UploadItem, UploadOut
from core import uploads
from core.errors import InvalidError
from core.settings import Settings
from training.datasets import DatasetAvailability, available_datasets
from training.datasets.archives import ARCHIVE_SUFFIXES, UPLOADING, ArchiveLimitError, temporary

router = APIRouter(prefix="/datasets", tags=["datasets"])


@router.get("", summary="Datasets and what each needs", responses=responses(401, 403))
def list_datasets(settings: SettingsDep, _: ReadKey) -> list[DatasetOut]:
    """Every dataset name, whether it can be read here, and what it needs otherwise; paths
    are relative to the server's DATA_DIR."""
    return [_shown(found, settings.data_dir) for found in available_datasets(settings.data_dir)]


def _shown(found: DatasetAvailability, data_dir: Path) -> DatasetOut:
    """A dataset's availability without the server's own paths: DATA_DIR stands for them."""
    where = None if found["location"] is None else Path(found["location"])
    if where is not None:
        where = where.relative_to(data_dir) if where.is_relative_to(data_dir) else Path(where.name)
    # The data folder as a whole path (not part of a longer name) becomes its setting's name.
    needs = re.sub(rf"(?<![\w/.]){re.escape(str(data_dir))}(?![\w.-])", "DATA_DIR", found["needs"])
    return DatasetOut.model_validate(
        {**found, "location": None if where is None else where.as_posix(), "needs": needs}
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Upload an ImageFolder archive",
    responses=responses(401, 403, 413, 422, 503),
)
def upload_dataset(
    file: UploadFile, session: SessionDep, settings: SettingsDep, caller: TrainCaller
) -> UploadOut:
    """Unpack a .zip/.tar/.tar.gz of class/image files safely; answers its dataset path.

    413 when it has more than 200,000 entries, would unpack past UPLOAD_MAX_UNPACKED_BYTES,
    past UPLOAD_MAX_RATIO times its own size, or past what is left of the owner's
    UPLOAD_QUOTA_BYTES (disk bytes) or UPLOAD_QUOTA_FILES; nothing is kept.
    """
    suffix = _archive_suffix(file.filename or "")
    uploads.sweep_temporaries(settings)  # what a killed upload of any process left
    with temporary(uploads.folder(settings), UPLOADING, suffix) as archive:
        try:
            with archive.open("wb") as sink:
                shutil.copyfileobj(file.file, sink, 2**20)
            row = uploads.store(archive, session=session, settings=settings, owner=caller.owner)
        except ArchiveLimitError as error:
            reason = error.__cause__ or error  # without the server's temporary path
            raise TooLargeError(
                f"cannot unpack {file.filename}: {reason}{_limits(settings)}"
            ) from error
        except ValueError as error:
            reason = error.__cause__ or error
            raise _invalid(f"cannot unpack {file.filename}: {reason}") from error
    return UploadOut(path=uploads.path_of(row.sha256), files=row.files, bytes=row.bytes)


@router.get("/uploads", summary="The uploaded datasets", responses=responses(401, 403))
def list_uploads(session: SessionDep, caller: ReadCaller) -> list[UploadItem]:
    """The uploads (each owner's row), newest first, with the bytes each owner's quota counts."""
    return [UploadItem.of(row) for row in uploads.visible(session=session, caller=caller)]


@router.delete(
    "/uploads/{upload_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Delete an upload",
    responses=responses(401, 403, 404, 409, 422, 503),
)
def delete_upload(
    upload_id: str, session: SessionDep, settings: SettingsDep, caller: TrainCaller
) -> None:
    """Remove the caller's upload (409 while a queued or running job reads it), freeing its
    quota; its files go when no other owner keeps the same archive."""
    tree = uploads.delete(session=session, settings=settings, caller=caller, upload_id=upload_id)
    if tree is not None:  # before the rows commit: an unreachable store is a 503
        uploads.delete_objects(settings, upload_id)
    session.commit()  # the rows go first: a failed commit leaves the files in place
    if tree is not None:
        shutil.rmtree(tree, ignore_errors=True)


def _limits(settings: Settings) -> str:
    """The limits an upload is held to, for a refusal's message."""
    return (
        f" (limits: UPLOAD_MAX_UNPACKED_BYTES {settings.upload_max_unpacked_bytes:,}, "
        f"UPLOAD_MAX_RATIO {settings.upload_max_ratio:g}, UPLOAD_QUOTA_BYTES "
        f"{settings.upload_quota_bytes:,} on disk and UPLOAD_QUOTA_FILES "
        f"{settings.upload_quota_files:,} per owner; delete uploads you no longer need "
        "with DELETE /api/v1/datasets/uploads/{id})"
    )


def _archive_suffix(filename: str) -> str:
    """The archive suffix of an uploaded file's name, or 422."""
    for suffix in ARCHIVE_SUFFIXES:
        if filename.lower().endswith(suffix):
            return suffix
    raise _invalid(f"{filename!r} is not a {'/'.join(ARCHIVE_SUFFIXES)} archive")


def _invalid(message: str) -> InvalidError:
    return InvalidError(message, field=("body", "file"))
