"""Datasets: what can be read here, and uploads of ImageFolder archives."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from fastapi import APIRouter, UploadFile, status

from api.deps import ReadKey, SettingsDep, TrainKey
from api.errors import responses
from api.schemas import DatasetOut, UploadOut
from core.errors import InvalidError
from training.datasets import available_datasets, unpack_archive
from training.datasets.archives import ARCHIVE_SUFFIXES

router = APIRouter(prefix="/datasets", tags=["datasets"])
UPLOADS = "uploads"  # under DATA_DIR; each upload unpacks into uploads/<sha256>/


@router.get("", summary="Datasets and what each needs", responses=responses(401, 403))
def list_datasets(settings: SettingsDep, _: ReadKey) -> list[DatasetOut]:
    """Every dataset name, whether it can be read here, and what it needs otherwise."""
    return [DatasetOut.model_validate(found) for found in available_datasets(settings.data_dir)]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Upload an ImageFolder archive",
    responses=responses(401, 403, 413, 422),
)
def upload_dataset(file: UploadFile, settings: SettingsDep, _: TrainKey) -> UploadOut:
    """Unpack a .zip/.tar/.tar.gz of class/image files safely; answers its dataset path."""
    suffix = _archive_suffix(file.filename or "")
    uploads = settings.data_dir / UPLOADS
    uploads.mkdir(parents=True, exist_ok=True)
    archive = uploads / f".upload-{uuid.uuid4().hex}{suffix}"
    try:
        with archive.open("wb") as sink:
            shutil.copyfileobj(file.file, sink, 2**20)
        folder = unpack_archive(archive, uploads)
    except ValueError as error:
        reason = error.__cause__ or error  # without the server's temporary path
        raise _invalid(f"cannot unpack {file.filename}: {reason}") from error
    finally:
        archive.unlink(missing_ok=True)
    return _described(folder, settings.data_dir)


def _archive_suffix(filename: str) -> str:
    """The archive suffix of an uploaded file's name, or 422."""
    for suffix in ARCHIVE_SUFFIXES:
        if filename.lower().endswith(suffix):
            return suffix
    raise _invalid(f"{filename!r} is not a {'/'.join(ARCHIVE_SUFFIXES)} archive")


def _described(folder: Path, data_dir: Path) -> UploadOut:
    """The upload's dataset path and size; 422 (and nothing kept) when it holds no images."""
    files = [path for path in folder.rglob("*") if path.is_file()]
    if not files:
        shutil.rmtree(folder)
        raise _invalid("the archive holds no images (expected class/image files)")
    return UploadOut(
        path=folder.relative_to(data_dir).as_posix(),
        files=len(files),
        bytes=sum(path.stat().st_size for path in files),
    )


def _invalid(message: str) -> InvalidError:
    return InvalidError(message, field=("body", "file"))
