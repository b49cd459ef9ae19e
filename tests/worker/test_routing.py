"""Routing by need with a real CPU worker on Postgres and Redis: a job that needs a GPU is
never taken (it stays queued, noted in its log), a CPU job sent after it runs; the worker
registers itself, counts its jobs, and turns lost once killed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import select

from core import queue, workers
from core.db.session import session_scope
from core.db.tables import Worker
from core.kinds import TrainJobSpec
from core.queue import QUEUE
from tests.helpers import job, messages, recipe, submit, wait_for, wait_status
from tests.services import BIN, LEASE_SECONDS, Service, make_settings, service_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cpu_worker(
    postgres_url: str, redis_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """One CPU worker, as `resnet-service worker` runs on a machine without GPUs."""
    root = tmp_path_factory.mktemp("routing")
    running = Service(make_settings(postgres_url, redis_broker_url, root), root)
    try:
        running.start("cpu")
        yield running
    finally:
        running.stop()


def _spec(**resources: object) -> TrainJobSpec:
    payload = {"model": {"name": "resnet8"}, "dataset": {"name": "digits", "validation": 0}}
    return TrainJobSpec.model_validate({**payload, "recipe": recipe(1), "resources": resources})


def _broker(service: Service) -> redis.Redis:
    return redis.Redis.from_url(service.settings.broker_url)


def _registered(url: str) -> dict[str, workers.Seen]:
    with session_scope(url) as session:
        seen = workers.listing(session=session, lease_seconds=LEASE_SECONDS)
        return {each.worker.name.split("@")[0]: each for each in seen}


def test_a_gpu_job_waits_noted_while_a_cpu_job_sent_after_it_runs(cpu_worker: Service) -> None:
    url, settings = cpu_worker.url, cpu_worker.settings
    registered = wait_for(lambda: _registered(url).get("cpu"), 30, "the worker to register")
    assert registered.state == "alive"
    assert (registered.worker.devices, registered.worker.queues) == (["cpu"], [QUEUE])

    gpu_job = submit(settings, _spec(device="gpu"))
    cpu_job = submit(settings, _spec())
    done = wait_status(url, cpu_job, "succeeded")
    assert done.device == "cpu"

    waiting = job(url, gpu_job)
    assert (waiting.status, waiting.attempt, waiting.worker) == ("queued", 0, None)
    assert _broker(cpu_worker).llen("gpu") == 1
    assert messages(url, gpu_job) == [
        "queued",
        "waiting for a worker with a GPU (queue gpu): no live worker takes it now; it stays "
        "queued until one starts",
    ]
    seen = wait_for(lambda: _done_once(url), 30, "the register to count the job")
    assert seen.worker.current_job_id is None


def _done_once(url: str) -> workers.Seen | None:
    seen = _registered(url)["cpu"]
    return seen if seen.worker.jobs_done == 1 else None


def test_a_gpu_job_sent_to_the_cpu_queue_goes_back_to_its_own(cpu_worker: Service) -> None:
    url, settings = cpu_worker.url, cpu_worker.settings
    broker = _broker(cpu_worker)
    job_id = submit(settings, _spec(gpus=2), deliveries=0)
    queue.enqueue(job_id, settings=settings, queue=QUEUE)  # as a stale sender would
    wait_for(lambda: broker.llen("gpu-2") == 1, 60, "the job to be sent to gpu-2")
    assert broker.llen(QUEUE) == 0
    row = job(url, job_id)
    assert (row.status, row.attempt) == ("queued", 0)
    # Behind it on the CPU queue, a CPU job still runs.
    wait_status(url, submit(settings, _spec(device="cpu")), "succeeded")


def test_gpus_all_on_a_machine_without_gpus_says_so(cpu_worker: Service) -> None:
    env = service_env(cpu_worker.settings, cpu_worker.root / "artifacts")
    env["CUDA_VISIBLE_DEVICES"] = ""
    ran = subprocess.run(
        [str(BIN / "resnet-service"), "worker", "--gpus", "all"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 2, ran.stderr
    assert "no GPU is visible on this machine" in ran.stderr
    assert "leave out --gpus to run one CPU worker" in ran.stderr


def test_a_killed_worker_turns_lost_and_stopped_ones_leave(cpu_worker: Service) -> None:
    url = cpu_worker.url
    cpu_worker.workers["cpu"].kill_all()
    lost = lambda: _registered(url)["cpu"].state == "lost"  # noqa: E731
    wait_for(lost, workers.WORKER_LOST_AFTER_LEASES * LEASE_SECONDS + 15, "the worker to be lost")
    cpu_worker.start("cpu2")
    started = wait_for(lambda: _registered(url).get("cpu2"), 30, "cpu2 to register")
    assert started.state == "alive"
    assert cpu_worker.workers["cpu2"].stop_warm() == 0
    cpu_worker.start("cpu3")
    wait_for(lambda: _registered(url).get("cpu3"), 30, "cpu3 to register")
    cpu_worker.workers["cpu3"].stop()  # a cold shutdown (SIGQUIT, as `up` stops its worker)
    with session_scope(url) as session:
        names = list(session.scalars(select(Worker.name)))
    assert [name.split("@")[0] for name in names] == ["cpu"]
