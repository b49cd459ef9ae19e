"""Artifacts in an S3 bucket (a real moto server): workers that share no folder with the API
or with each other train, checkpoint, resume and are served from the store.

A worker is killed (kill -9) mid-run; another with its own ARTIFACT_DIR resumes from the
bucket on the same step axis. The API, with a folder of its own, serves the job's best
checkpoint, serves on while its store is down once the model is loaded (an unloaded one is
a 503), and deleting the job leaves no object of it. A store that cannot be reached hands
a running job back instead of failing it.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from PIL import Image

from api.app import create_app
from core import artifacts, jobs, layout
from core.db.session import session_scope
from core.kinds import EvaluateJobSpec
from core.settings import Settings
from core.storage import store_for
from tests import images
from tests.helpers import (
    checkpoint_rows,
    claim,
    finish,
    job,
    make_key,
    messages,
    metric_counts,
    metric_steps,
    new_job,
    submit,
    train_spec,
    wait_for,
    wait_status,
)
from tests.services import (
    REDIS_URL,
    WorkerProcess,
    free_port,
    make_settings,
    on_bucket,
    s3_server,
    service_env,
)
from worker import runner
from worker.homes import RETRY_MAX_S

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = pytest.mark.slow

BUCKET = "resnet-test-artifacts"
STEPS_PER_EPOCH = 22  # digits, batch 64, no validation split
EPOCHS = 6
PREDICT = "/api/v1/predict"


def store_env(settings: Settings) -> dict[str, str]:
    """A worker process's environment for store settings (its store and its own folders)."""
    return {
        **service_env(settings, settings.artifact_dir),
        "ARTIFACT_STORE": "s3",
        "S3_ENDPOINT_URL": str(settings.s3_endpoint_url),
        "S3_BUCKET": BUCKET,
        "S3_ACCESS_KEY_ID": "test",
        "S3_SECRET_ACCESS_KEY": "test",
        "ARTIFACT_CACHE_DIR": str(settings.artifact_cache_dir),
    }


@pytest.fixture(scope="module")
def base(
    postgres_url: str, redis_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    """The database and broker the workers share (and a short lease)."""
    return make_settings(postgres_url, redis_broker_url, tmp_path_factory.mktemp("shared"))


@pytest.fixture(scope="module")
def bucket(s3_url: str) -> S3Client:
    """A boto3 client of the moto server, to look into the bucket as an operator would."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=s3_url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


def objects(bucket: S3Client, prefix: str) -> dict[str, str]:
    """The bucket's keys under `prefix` (list_objects_v2), each with its bytes' sha256."""
    listed = bucket.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    found = {}
    for item in listed.get("Contents", []):
        body = bucket.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
        found[item["Key"]] = hashlib.sha256(body).hexdigest()
    return found


@pytest.fixture(scope="module")
def trained(base: Settings, s3_url: str, tmp_path_factory: pytest.TempPathFactory) -> uuid.UUID:
    """A train job checkpointed to the bucket by one worker, killed (kill -9) after two
    checkpoints, and finished by another: no two of them share a folder."""
    url = base.database_url
    first = on_bucket(base, s3_url, BUCKET, tmp_path_factory.mktemp("first"))
    second = on_bucket(base, s3_url, BUCKET, tmp_path_factory.mktemp("second"))
    workers = [WorkerProcess("first", store_env(first), first.artifact_dir.parent / "log")]
    try:
        workers[0].wait_ready()
        job_id = submit(base, train_spec(epochs=EPOCHS), max_attempts=4)
        wait_for(
            lambda: job(url, job_id).step >= 2 * STEPS_PER_EPOCH and checkpoint_rows(url, job_id),
            240,
            "two epochs and a checkpoint",
        )
        workers[0].kill_all()
        workers.append(
            WorkerProcess("second", store_env(second), second.artifact_dir.parent / "log")
        )
        workers[1].wait_ready()
        wait_status(url, job_id, "succeeded", timeout=240)
        # The worker that ended the job keeps no copy of it; the killed one's stays.
        copy = second.artifact_dir / "jobs" / str(job_id)
        wait_for(lambda: not copy.exists(), 30, "the second worker to drop its copy")
        assert list((first.artifact_dir / "jobs" / str(job_id) / "checkpoints").glob("step-*"))
        return job_id
    finally:
        for worker in workers:  # stopped now: no reaper of theirs sees the later tests' jobs
            worker.stop()


def test_checkpoints_land_in_the_bucket_with_their_sha256(
    base: Settings, trained: uuid.UUID, bucket: S3Client
) -> None:
    rows = checkpoint_rows(base.database_url, trained)
    assert rows
    assert all(row.path.startswith(f"jobs/{trained}/checkpoints/step-") for row in rows)
    assert sum(row.is_best for row in rows) == 1
    # Each row's object has the row's sha256; pruned checkpoints' objects went with their rows.
    assert objects(bucket, f"jobs/{trained}/") == {row.path: row.sha256 for row in rows}


def test_a_second_worker_resumes_from_the_bucket_on_one_step_axis(
    base: Settings, trained: uuid.UUID
) -> None:
    url = base.database_url
    done = job(url, trained)
    assert (done.attempt, done.step) == (2, EPOCHS * STEPS_PER_EPOCH)
    log = messages(url, trained)
    fetched = [line for line in log if line.endswith("from the object store")]
    assert len(fetched) == 1, log
    assert fetched[0].startswith("fetched step-")
    resumed = [line for line in log if line.startswith("resumed from step-")]
    assert len(resumed) == 1, log
    assert resumed[0].split()[2] == fetched[0].split()[1]  # from the checkpoint it fetched
    steps = metric_steps(url, trained, "train/loss")
    assert steps == sorted(set(steps))
    assert steps[-1] == done.step
    rows, distinct = metric_counts(url, trained)
    assert rows == distinct


def test_an_evaluate_job_reads_the_best_checkpoint_from_the_bucket(
    base: Settings, trained: uuid.UUID, s3_url: str, tmp_path: Path
) -> None:
    evaluator = on_bucket(base, s3_url, BUCKET, tmp_path)  # a machine that never trained it
    spec = EvaluateJobSpec.model_validate(
        {
            "kind": "evaluate",
            "source_job": str(trained),
            "checkpoint": "best",
            "dataset": {"name": "digits", "validation": 0},
        }
    )
    with session_scope(base.database_url) as session:
        job_id = jobs.create(session=session, settings=base, spec=spec, max_attempts=1).id
    runner.execute(job_id, settings=evaluator, worker="evaluator")

    done = job(base.database_url, job_id)
    assert done.status == "succeeded", messages(base.database_url, job_id)
    best = next(row for row in checkpoint_rows(base.database_url, trained) if row.is_best)
    assert done.summary is not None
    assert done.summary["checkpoint"]["sha256"] == best.sha256
    assert done.summary["final_test_error"] < 0.5
    # Fetched into the evaluator's download cache, named by its sha256.
    assert [path.name.split(".")[0] for path in evaluator.artifact_cache_dir.iterdir()] == [
        best.sha256
    ]


def test_a_loaded_model_serves_on_while_the_store_is_down_an_unloaded_one_is_a_503(
    base: Settings, trained: uuid.UUID, s3_url: str, tmp_path: Path
) -> None:
    # The trained job's objects, copied to a server of this test's own, which then stops.
    source = on_bucket(base, s3_url, BUCKET, tmp_path / "source")
    unloaded = stored_elsewhere(base)
    with contextlib.ExitStack() as server:
        settings = on_bucket(base, server.enter_context(s3_server()), BUCKET, tmp_path / "api")
        for row in checkpoint_rows(base.database_url, trained):
            fetched = artifacts.local_file(source, row.path, row.sha256)
            store_for(settings).put(row.path, fetched, row.sha256)
        with admin_client(settings) as api:

            def ask(ref: str) -> httpx.Response:
                answer: httpx.Response = api.post(
                    PREDICT, params={"model": ref}, files=digit_files()
                )
                return answer

            assert ask(str(trained)).status_code == 200
            server.close()  # the store goes away

            assert ask(str(trained)).status_code == 200  # loaded: serves on
            refused = ask(str(unloaded))
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "5"
            assert "artifact store is unavailable" in refused.json()["error"]["message"]
            # Its objects cannot go now: the job stays, to be deleted once the store is back.
            assert api.delete(f"/api/v1/jobs/{unloaded}").status_code == 503
            assert api.get(f"/api/v1/jobs/{unloaded}").status_code == 200


def test_the_api_serves_from_the_bucket_and_a_deleted_job_leaves_no_object(
    base: Settings, trained: uuid.UUID, s3_url: str, bucket: S3Client, tmp_path: Path
) -> None:
    settings = on_bucket(base, s3_url, BUCKET, tmp_path / "api")
    best = next(row for row in checkpoint_rows(base.database_url, trained) if row.is_best)
    with admin_client(settings) as api:
        answer = api.post(PREDICT, params={"model": str(trained)}, files=digit_files())
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"]["sha256"] == best.sha256
        assert objects(bucket, f"jobs/{trained}/")
        deleted = api.delete(f"/api/v1/jobs/{trained}")
        assert deleted.status_code == 204, deleted.text
    assert objects(bucket, f"jobs/{trained}/") == {}
    assert api.get(f"/api/v1/jobs/{trained}").status_code == 404


def test_a_store_that_stays_down_hands_a_running_job_back(
    base: Settings, broker: redis.Redis, tmp_path: Path
) -> None:
    db = broker.connection_pool.connection_kwargs["db"]
    # Nothing listens at the store's address; the hand-back's message goes to a queue of
    # the test's own.
    dead = on_bucket(base, f"http://127.0.0.1:{free_port()}", BUCKET, tmp_path)
    dead = dead.model_copy(update={"broker_url": f"{REDIS_URL}/{db}"})
    job_id = submit_queued(dead)
    started = time.monotonic()
    runner.execute(job_id, settings=dead, worker="outage")
    took = time.monotonic() - started

    row = job(base.database_url, job_id)
    log = messages(base.database_url, job_id)
    assert (row.status, row.attempt, row.error) == ("queued", 1, None), log
    assert "handed back: the object store was unreachable" in log, log
    assert row.max_attempts == 4  # a hand-back is no failed attempt
    assert checkpoint_rows(base.database_url, job_id) == []  # no row names a missing object
    # Written on the worker's disk, then retried for a lease (less its last backoff).
    assert list((dead.artifact_dir / "jobs" / str(job_id) / "checkpoints").glob("step-*.pt"))
    assert took >= base.lease_seconds - RETRY_MAX_S


def submit_queued(settings: Settings) -> uuid.UUID:
    """A one-epoch train job, queued in the database only (the test runs it itself)."""
    with session_scope(settings.database_url) as session:
        return jobs.create(
            session=session, settings=settings, spec=train_spec(epochs=1), max_attempts=3
        ).id


def stored_elsewhere(settings: Settings) -> uuid.UUID:
    """A succeeded train job whose best checkpoint is an object (never fetched here)."""
    url = settings.database_url
    job_id = new_job(url, model={"name": "resnet8"})
    token = claim(url, job_id)
    key = layout.checkpoint_key(job_id, "step-1.pt")
    with session_scope(url) as session:
        jobs.record_checkpoint(
            session=session,
            job_id=job_id,
            token=token,
            step=1,
            epoch=1,
            path=key,
            sha256="0" * 64,
            size=1,
            is_best=True,
            kept=[key],
        )
    finish(url, job_id, token, best_test_error=0.5)
    return job_id


def admin_client(settings: Settings) -> TestClient:
    """A client of a new app on `settings`, with an admin key."""
    key = make_key(settings.database_url, "admin")
    return TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"})


def digit_files() -> list[tuple[str, tuple[str, bytes, str]]]:
    """One 8x8 grayscale PNG, as a multipart `files` list."""
    png = images.encode(Image.new("L", (8, 8), color=128))
    return [("files", ("digit.png", png, "image/png"))]
