"""Which checkpoint paths the service opens: files under ARTIFACT_DIR, or object keys under
`jobs/` of the bucket; nothing else."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from core import artifacts, layout
from core.settings import Settings
from core.storage import recorded_file


@pytest.fixture
def settings(local_settings: Settings) -> Settings:
    """Checkpoints in an S3 bucket, the artifact folder local."""
    return local_settings.model_copy(update={"artifact_store": "s3"})


def test_a_job_checkpoint_key_lies_in_the_store(settings: Settings) -> None:
    job_id = uuid.uuid4()
    key = layout.checkpoint_key(job_id, "step-100.pt")
    assert key == f"jobs/{job_id}/checkpoints/step-100.pt"
    assert recorded_file(key) is None
    assert artifacts.is_stored(settings, key)


@pytest.mark.parametrize(
    "path",
    ["uploads/abc/archive.zip", "jobs/../secrets.pt", "jobs//x.pt", "jobs", "elsewhere/x.pt"],
)
def test_keys_outside_jobs_or_not_plain_are_not_in_the_store(settings: Settings, path: str) -> None:
    assert not artifacts.is_stored(settings, path)


def test_files_are_in_the_store_only_under_the_artifact_folder(
    settings: Settings, tmp_path: Path
) -> None:
    inside = settings.artifact_dir / "jobs" / "x" / "checkpoints" / "best.pt"
    assert recorded_file(str(inside)) == inside
    assert artifacts.is_stored(settings, str(inside))
    assert not artifacts.is_stored(settings, str(tmp_path / "other" / "best.pt"))


def test_a_local_file_is_its_own_local_copy(settings: Settings, tmp_path: Path) -> None:
    path = str(tmp_path / "artifacts" / "best.pt")
    assert artifacts.local_file(settings, path, "0" * 64) == Path(path)


def test_deleting_objects_of_the_local_store_deletes_nothing(local_settings: Settings) -> None:
    assert artifacts.delete_job_objects(local_settings, uuid.uuid4()) == 0
