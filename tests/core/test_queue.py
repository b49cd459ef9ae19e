"""The queues: the embedded broker's depth, and routing by need on Redis."""

from __future__ import annotations

import gc
from pathlib import Path

import redis

from core import jobs, queue, resources
from core.db.session import session_scope
from core.kinds import TrainJobSpec
from core.settings import Settings
from tests.services import REDIS_URL

DIGITS = {"model": {"name": "resnet8"}, "dataset": {"name": "digits"}, "recipe": {"epochs": 1}}


def test_reading_the_queue_depth_again_and_again_holds_no_broker_connection(
    tmp_path: Path,
) -> None:
    # The reaper and /metrics read the depth every few seconds for the life of a process.
    # The broker's connection pool holds 15; a read that kept one would make the 16th wait
    # 30 s and fail, and stop the worker, as it once did after 80 minutes of a study.
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
    )
    gc.disable()  # a read's connection must come back at once, not when a collection runs
    try:
        assert [queue.depth(settings, timeout=2) for _ in range(20)] == [0] * 20
    finally:
        gc.enable()


def test_a_job_goes_to_the_queue_of_its_needs_and_the_depth_counts_every_queue(
    postgres_url: str, broker: redis.Redis
) -> None:
    db = broker.connection_pool.connection_kwargs["db"]
    settings = Settings(database_url=postgres_url, broker_url=f"{REDIS_URL}/{db}")
    broker.delete(*resources.ALL_QUEUES)
    needs = {"small": {}, "gpu": {"device": "gpu"}, "four": {"gpus": 4}, "cpu": {"device": "cpu"}}
    ids = {}
    with session_scope(postgres_url) as session:
        for label, asked in needs.items():
            spec = TrainJobSpec.model_validate({**DIGITS, "resources": asked})
            ids[label] = jobs.create(
                session=session, settings=settings, spec=spec, max_attempts=3
            ).id
    queue.enqueue_committed(ids.values(), settings=settings)
    queue.enqueue(ids["gpu"], settings=settings)  # one more, its queue read from its spec
    held = {name: broker.llen(name) for name in ("cpu", "gpu", "gpu-4")}
    assert held == {"cpu": 2, "gpu": 2, "gpu-4": 1}
    assert queue.depth(settings, timeout=2) == 5
    broker.delete(*resources.ALL_QUEUES)
