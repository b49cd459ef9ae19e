"""The layout of object keys: every key plain and relative, each kind under its prefix."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from core import layout
from core.storage import check_key

JOB = uuid.UUID("00000000-0000-4000-8000-000000000001")
UPLOAD = "a" * 64


def test_a_jobs_files_lie_under_its_prefix() -> None:
    prefix = f"jobs/{JOB}/"
    assert layout.job_prefix(JOB) == prefix
    assert layout.job_file_key(JOB, "predictions.csv") == f"{prefix}predictions.csv"
    assert layout.checkpoints_prefix(JOB) == f"{prefix}checkpoints/"
    assert layout.checkpoint_key(JOB, "step-100.pt") == f"{prefix}checkpoints/step-100.pt"
    assert layout.export_prefix(JOB, 3) == f"{prefix}exports/3/"
    assert layout.export_key(JOB, 3, ".torchscript.pt") == f"{prefix}exports/3/model.torchscript.pt"


def test_an_uploads_archive_is_named_by_its_kind() -> None:
    assert layout.upload_path(UPLOAD) == f"uploads/{UPLOAD}"
    assert layout.upload_prefix(UPLOAD) == f"uploads/{UPLOAD}/"
    assert layout.archive_key(UPLOAD, "Shapes.ZIP") == f"uploads/{UPLOAD}/archive.zip"
    assert layout.archive_key(UPLOAD, "shapes.tar.gz") == f"uploads/{UPLOAD}/archive.tar"


def test_every_key_is_a_plain_relative_path() -> None:
    keys = [
        layout.job_file_key(JOB, "summary.json"),
        layout.checkpoint_key(JOB, "best.pt"),
        layout.export_key(JOB, 1, ".onnx"),
        layout.archive_key(UPLOAD, "a.zip"),
    ]
    assert [check_key(key) for key in keys] == keys


@pytest.mark.parametrize(
    ("key", "job", "export"),
    [
        (f"jobs/{JOB}/checkpoints/step-1.pt", True, False),
        (f"jobs/{JOB}/exports/3/model.onnx", True, True),
        (f"jobs/{JOB}/exports", True, False),
        (f"uploads/{UPLOAD}/archive.zip", False, False),
        ("jobsx/a.pt", False, False),
    ],
)
def test_which_keys_are_jobs_and_exports(key: str, job: bool, export: bool) -> None:
    assert layout.is_job_key(key) is job
    assert layout.is_export_key(key) is export


def test_a_jobs_folder_follows_its_keys(tmp_path: Path) -> None:
    folder = layout.job_dir(tmp_path, JOB)
    assert folder == tmp_path / layout.job_prefix(JOB).rstrip("/")
    assert folder / "checkpoints" / "best.pt" == tmp_path / layout.checkpoint_key(JOB, "best.pt")
