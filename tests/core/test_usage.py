"""A job's stored bytes as each store holds them: the local folder's files, the bucket's
objects (moto's S3 server), its exports left out either way."""

from __future__ import annotations

import uuid
from pathlib import Path

from core import artifacts, layout, usage
from core.settings import Settings
from core.storage import store_for
from tests.services import on_bucket
from training.checkpoints import sha256_of


def _files(folder: Path) -> dict[str, Path]:
    """A job's checkpoint, result file and export, of known sizes."""
    sizes = {"checkpoints/step-1.pt": 3000, "predictions.csv": 200, "exports/7/model.pt2": 5000}
    made = {}
    for name, size in sizes.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        made[name] = path
    return made


def test_a_jobs_bytes_are_its_files_but_its_exports(tmp_path: Path) -> None:
    settings = Settings(artifact_dir=tmp_path / "artifacts")
    job_id = uuid.uuid4()
    _files(artifacts.job_dir(settings, job_id))

    assert usage.job_bytes(settings, job_id) == 3200
    assert usage.job_bytes(settings, uuid.uuid4()) == 0


def test_a_jobs_bytes_in_a_bucket_are_its_objects_but_its_exports(
    tmp_path: Path, s3_url: str
) -> None:
    settings = on_bucket(Settings(), s3_url, f"usage-{uuid.uuid4().hex[:8]}", tmp_path)
    job_id, store = uuid.uuid4(), store_for(settings)
    made = _files(tmp_path / "made")
    for name, path in made.items():
        store.put(layout.job_file_key(job_id, name), path, sha256_of(path))
    other, export = uuid.uuid4(), made["exports/7/model.pt2"]  # another job's file
    store.put(layout.job_file_key(other, "summary.json"), export, sha256_of(export))

    assert usage.job_bytes(settings, job_id) == 3200
    assert usage.job_bytes(settings, other) == 5000
