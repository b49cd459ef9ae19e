"""POST /jobs/{id}/retry with a real worker: a job that failed on a full disk resumes from its
last verified checkpoint on the same step axis once space is freed; a job with no
checkpoint starts over and says so; only failed, cancelled or pruned jobs can be retried.

The worker's ARTIFACT_DIR is a real tmpfs mounted for the module (the tests run as root),
filled so that the job's first checkpoint fits and its second does not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core import artifacts, jobs
from core.db.session import session_scope
from tests.helpers import (
    LOG_EVERY,
    checkpoint_rows,
    make_key,
    messages,
    metric_counts,
    metric_steps,
    submit,
    train_spec,
    wait_status,
)
from tests.services import Service, make_settings
from training import checkpoints

pytestmark = pytest.mark.slow

STEPS_PER_EPOCH = 22
CHECKPOINT_BYTES = 629_847  # ResNet-8 on digits: model, momentum, RNG and the run's spec
MARGIN = 1024 * 1024  # the worker's CHECKPOINT_FREE_MARGIN_BYTES
# Free space for one save of a step file and best.pt (2C + margin) and not for a second
# save of even one file (C + margin): 2.5C + margin, halfway.
FREE = int(2.5 * CHECKPOINT_BYTES) + MARGIN


@pytest.fixture(scope="module")
def service(
    postgres_url: str, redis_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """One worker whose ARTIFACT_DIR is a 16 MiB tmpfs, with CHECKPOINT_FREE_MARGIN_BYTES set."""
    root = tmp_path_factory.mktemp("retry")
    disk = root / "artifacts"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)]
    done = subprocess.run(mount, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"cannot mount a tmpfs (run the tests as root): {done.stderr}"
    os.environ["CHECKPOINT_FREE_MARGIN_BYTES"] = str(MARGIN)  # the worker's environment
    running = Service(make_settings(postgres_url, redis_broker_url, root), root)
    try:
        running.start("r1")
        yield running
    finally:
        running.stop()
        del os.environ["CHECKPOINT_FREE_MARGIN_BYTES"]
        subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.fixture(scope="module")
def client(service: Service) -> Iterator[TestClient]:
    key = make_key(service.url, "admin")  # the jobs here are made without an owner
    with TestClient(
        create_app(service.settings), headers={"Authorization": f"Bearer {key}"}
    ) as client:
        yield client


def test_a_job_failed_on_a_full_disk_resumes_from_its_last_checkpoint(
    service: Service, client: TestClient
) -> None:
    disk = service.settings.artifact_dir
    filler = disk / "filler"
    filler.write_bytes(bytes(shutil.disk_usage(disk).free - FREE))
    url = service.url
    job_id = submit(service.settings, train_spec(epochs=3))
    failed = wait_status(url, job_id, "failed", timeout=180)
    assert failed.error is not None
    assert "not enough free disk space to write checkpoint step-44.pt" in failed.error
    best = artifacts.job_dir(service.settings, job_id) / "checkpoints" / checkpoints.BEST
    [row] = [row for row in checkpoint_rows(url, job_id) if row.is_best]
    assert (row.step, Path(row.path)) == (STEPS_PER_EPOCH, best)
    assert checkpoints.sha256_of(best) == row.sha256  # the last good checkpoint is intact

    refused = client.post(f"/api/v1/jobs/{job_id}/retry")
    filler.unlink()  # (retrying before freeing space would fail the same way)
    assert refused.status_code == 202, refused.text
    answer = refused.json()
    assert answer["resume_step"] == STEPS_PER_EPOCH
    assert answer["message"] == "retried: resumes from step-22.pt at step 22"
    assert answer["job"]["status"] in ("queued", "running")
    again = client.post(f"/api/v1/jobs/{job_id}/retry")
    assert again.status_code == 409
    refused = again.json()["error"]["message"]
    assert "only a failed, cancelled or pruned job can be retried" in refused

    done = wait_status(url, job_id, "succeeded", timeout=180)
    total = 3 * STEPS_PER_EPOCH
    assert (done.step, done.attempt) == (total, 2)
    assert metric_steps(url, job_id, "train/loss") == list(range(LOG_EVERY, total + 1, LOG_EVERY))
    assert metric_steps(url, job_id, "test/error") == [22, 44, 66]
    rows, distinct = metric_counts(url, job_id)
    assert rows == distinct
    log = messages(url, job_id)
    assert "retried: resumes from step-22.pt at step 22" in log
    assert "resumed from step-22.pt at step 22" in log
    assert client.post(f"/api/v1/jobs/{job_id}/retry").status_code == 409  # succeeded


def test_a_job_without_a_checkpoint_starts_over_and_says_so(
    service: Service, client: TestClient
) -> None:
    with session_scope(service.url) as session:  # queued, never sent to the broker
        job_id = jobs.create(
            session=session, settings=service.settings, spec=train_spec(epochs=1), max_attempts=3
        ).id
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    retried = client.post(f"/api/v1/jobs/{job_id}/retry")
    assert retried.status_code == 202, retried.text
    assert retried.json()["resume_step"] is None
    assert "starts over from step 0" in retried.json()["message"]
    done = wait_status(service.url, job_id, "succeeded", timeout=180)
    assert done.step == STEPS_PER_EPOCH
    assert client.post(f"/api/v1/jobs/{uuid.uuid4()}/retry").status_code == 404
