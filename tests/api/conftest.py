"""The API against real Postgres and Redis: an app per test module, a Redis db of its own."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from api import keys
from api.app import create_app
from core import jobs
from core.db.session import session_scope
from core.queue import QUEUE
from core.settings import Settings
from core.specs import TrainJobSpec
from tests.conftest import REDIS_URL, serve
from training import checkpoints
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.specs import TrainSpec

TRAIN = {"kind": "train", "model": {"name": "resnet20"}, "dataset": {"name": "digits"}}


def _claim_redis_db() -> tuple[redis.Redis, str]:
    """An empty Redis database 1..15, claimed with a marker key for this test run."""
    for number in random.sample(range(1, 16), 15):
        url = f"{REDIS_URL}/{number}"
        client = redis.Redis.from_url(url)
        # Empty: no worker of another run has declared its queue bindings there.
        if client.dbsize() == 0 and client.set("resnet-test-claim", "api", nx=True, ex=600):
            return client, url
        client.close()
    raise RuntimeError("every Redis database 1..15 is claimed by another test run")


@pytest.fixture(scope="module")
def broker() -> Iterator[redis.Redis]:
    """A Redis client on a database of this module's own, flushed afterwards."""
    client, _ = _claim_redis_db()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def queue(broker: redis.Redis) -> redis.Redis:
    """The broker with an empty train queue."""
    broker.delete(QUEUE)
    return broker


@pytest.fixture(scope="module")
def settings(
    postgres_url: str, broker: redis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    """The service's settings for this module: auth on, fast event-stream polls."""
    root = tmp_path_factory.mktemp("service")
    db = broker.connection_pool.connection_kwargs["db"]
    return Settings(
        database_url=postgres_url,
        broker_url=f"{REDIS_URL}/{db}",
        artifact_dir=root / "artifacts",
        data_dir=root / "data",
        auth_enabled=True,
        stream_poll_seconds=0.05,
        max_upload_bytes=64 * 1024,
    )


@pytest.fixture(scope="module")
def live_url(settings: Settings) -> Iterator[str]:
    """The module's API (with the module's settings) served by uvicorn, in a thread."""
    with serve(create_app(settings)) as url:
        yield url


def make_key(url: str, *scopes: str) -> str:
    """A new API key with `scopes`, in plaintext."""
    with session_scope(url) as session:
        return keys.create_key(session=session, name="test", scopes=scopes)[1]


@pytest.fixture(scope="module")
def anonymous(settings: Settings) -> Iterator[TestClient]:
    """A client of the app that sends no API key."""
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def client(settings: Settings, anonymous: TestClient) -> Iterator[TestClient]:
    """A client of the same app with a read + train key."""
    key = make_key(settings.database_url, "read", "train")
    with TestClient(anonymous.app, headers={"Authorization": f"Bearer {key}"}) as authorized:
        yield authorized


def new_job(url: str, **fields: object) -> uuid.UUID:
    """A queued train job made directly in the database."""
    spec = TrainJobSpec.model_validate({**TRAIN, **fields})
    with session_scope(url) as session:
        return jobs.create(session=session, spec=spec, max_attempts=3).id


def claim(url: str, job_id: uuid.UUID) -> int:
    """Claim a job as a worker would; returns the fencing token."""
    with session_scope(url) as session:
        held = jobs.claim(
            session=session, job_id=job_id, worker="test", device="cpu", lease_seconds=60
        )
    assert held is not None
    return held.token


def finish(url: str, job_id: uuid.UUID, token: int, **summary: float) -> None:
    """End a claimed job as succeeded, with summary columns."""
    with session_scope(url) as session:
        jobs.finish(
            session=session, job_id=job_id, token=token, status="succeeded", summary=summary
        )


def artifact_folder(settings: Settings, job_id: uuid.UUID) -> Path:
    """Where a job's files live."""
    return settings.artifact_dir / "jobs" / str(job_id)


TINY = {
    "model": {"name": "resnet8"},
    "dataset": {"name": "synthetic", "image_size": 8, "train_size": 32, "test_size": 8},
    "recipe": {"iterations": 2, "batch_size": 16, "checkpoint_every": 1},
}


def trained_job(settings: Settings) -> uuid.UUID:
    """A succeeded train job whose checkpoints (steps 1 and 2, best at 2) are real files."""
    url = settings.database_url
    job_id = new_job(url, model={"name": "resnet8"})
    token = claim(url, job_id)
    out = artifact_folder(settings, job_id)
    spec = TrainSpec.model_validate(TINY)
    fit(spec, load_dataset(spec.dataset, data_root=out), out_dir=out, sink=RecordingSink())
    folder = out / "checkpoints"
    saved = [(1, folder / "step-1.pt", False), (2, folder / checkpoints.BEST, True)]
    kept = [str(path) for _, path, _ in saved]
    with session_scope(url) as session:
        for step, path, is_best in saved:
            jobs.record_checkpoint(
                session=session,
                job_id=job_id,
                token=token,
                step=step,
                epoch=step,
                path=str(path),
                sha256=checkpoints.sha256_of(path),
                size=path.stat().st_size,
                is_best=is_best,
                kept=kept,
            )
    finish(url, job_id, token, best_test_error=0.5, final_test_error=0.6, params=75_002)
    return job_id
