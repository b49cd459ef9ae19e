"""Many hosts on one machine, each a network namespace: a job killed on one worker host
resumes on another from the object store, and the API host serves its checkpoint.

The service host (the root namespace) holds the API, Postgres and Redis (relayed from
127.0.0.1) and an S3 server, all on one address of a bridge. Worker hosts A and B reach
them only over that address, and each has artifact, cache and data folders of its own;
none is the API's. Worker A trains until its first checkpoints, is killed with -9 (its
whole process group), worker B takes the job over once its lease runs out, resumes from
the checkpoint it fetches from the store, and finishes; then `POST /api/v1/predict` on
the API host classifies an image with the job's best checkpoint, fetched into the API's
own cache.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from core.db.tables import Job
from tests import images
from tests.helpers import (
    checkpoint_rows,
    job,
    make_key,
    messages,
    train_spec,
    wait_for,
    wait_status,
)
from tests.hosts import Forwarder, Host, Network, network
from tests.services import (
    LEASE_SECONDS,
    claimed_redis_db,
    free_port,
    s3_server,
    wait_until_answering,
)

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
BUCKET = "resnet-hosts"


@pytest.fixture(scope="module")
def net() -> Iterator[Network]:
    with network() as made:
        yield made


def _relay(stack: ExitStack, net: Network, url: str, default_port: int) -> str:
    """Relay a loopback service to the service address (while `stack` lasts); the URL the
    hosts reach it by."""
    parts = urlsplit(url)
    port = free_port()
    stack.enter_context(Forwarder((net.address, port), ("127.0.0.1", parts.port or default_port)))
    return url.replace(parts.netloc.rsplit("@", 1)[-1], f"{net.address}:{port}")


def _environment(root: Path, database_url: str, broker_url: str, s3_url: str) -> dict[str, str]:
    """A process's settings: the services at the given URLs, its folders under `root`."""
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "BROKER_URL": broker_url,
        "ARTIFACT_STORE": "s3",
        "S3_ENDPOINT_URL": s3_url,
        "S3_BUCKET": BUCKET,
        "S3_ACCESS_KEY_ID": "hosts",
        "S3_SECRET_ACCESS_KEY": "hosts-secret",
        "ARTIFACT_DIR": str(root / "artifacts"),
        "ARTIFACT_CACHE_DIR": str(root / "cache"),
        "DATA_DIR": str(root / "data"),
        "LEASE_SECONDS": str(LEASE_SECONDS),
        "HEARTBEAT_SECONDS": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _start_worker(host: Host, env: dict[str, str], root: Path) -> None:
    """`resnet-service worker` on `host`; waits until it is ready."""
    log = root / "worker.log"
    process = host.popen(
        [str(BIN / "resnet-service"), "worker", "--name", f"{host.name}@%h"], env=env, log=log
    )
    wait_for(
        lambda: "ready." in log.read_text(errors="replace") or process.poll() is not None,
        300,
        f"the worker on {host.name} to start",
    )
    assert process.poll() is None, log.read_text(errors="replace")


@contextmanager
def _api(net: Network, env: dict[str, str], root: Path) -> Iterator[str]:
    """`resnet-service api` on the service address; its base URL while it runs."""
    port = free_port()
    base = f"http://{net.address}:{port}"
    log = root / "api.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN / "resnet-service"), "api", "--host", net.address, "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with log.open("rb") as output:
            wait_until_answering(f"{base}/api/v1/healthz", process, output)
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_a_job_killed_on_host_a_resumes_on_host_b_and_is_served_by_the_api_host(
    net: Network, postgres_url: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    timeline: list[str] = []

    def mark(what: str) -> None:
        timeline.append(f"{time.monotonic() - started:7.1f} s  {what}")

    roots = {name: tmp_path / name for name in ("api", "a", "b")}
    for root in roots.values():
        root.mkdir()
    with ExitStack() as stack:
        _, broker_url = stack.enter_context(claimed_redis_db())
        s3_url = stack.enter_context(s3_server(host=net.address))
        hosts_database = _relay(stack, net, postgres_url, 5432)
        hosts_broker = _relay(stack, net, broker_url, 6379)
        base = stack.enter_context(
            _api(net, _environment(roots["api"], postgres_url, broker_url, s3_url), roots["api"])
        )
        key = make_key(postgres_url, "admin")
        http = stack.enter_context(
            httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        )
        host_a, host_b = net.add_host("a"), net.add_host("b")
        environment = {
            name: _environment(roots[name], hosts_database, hosts_broker, s3_url)
            for name in ("a", "b")
        }
        _start_worker(host_a, environment["a"], roots["a"])
        mark("worker A ready")

        submitted = http.post("/api/v1/jobs", json=train_spec(epochs=6).model_dump(mode="json"))
        assert submitted.status_code == 202, submitted.text
        job_id = uuid.UUID(submitted.json()["id"])
        mark("job submitted")
        wait_for(lambda: checkpoint_rows(postgres_url, job_id), 300, "a checkpoint on A")
        first = job(postgres_url, job_id)
        assert host_a.name in (first.worker or ""), first.worker
        host_a.kill_all()  # kill -9 of the worker and its job process
        saved = checkpoint_rows(postgres_url, job_id)[-1].step
        mark(f"worker A killed (-9); its last checkpoint at step {saved}")

        _start_worker(host_b, environment["b"], roots["b"])
        mark("worker B ready")

        def taken_over() -> Job | None:
            row = job(postgres_url, job_id)
            return row if row.attempt >= 2 and row.status == "running" else None

        resumed = wait_for(taken_over, 120, "worker B to take the job over")
        assert host_b.name in (resumed.worker or ""), resumed.worker
        mark("job running on B")
        done = wait_status(postgres_url, job_id, "succeeded", timeout=600)
        mark(f"job succeeded on B; step {done.step}")
        log = messages(postgres_url, job_id)
        resumed_from = [m for m in log if m.startswith("resumed from step-")]
        # From A's checkpoint, which B's folders never held: it came from the store.
        assert len(resumed_from) == 1, log
        assert f"at step {saved}" in resumed_from[0], log

        answer = http.post(
            "/api/v1/predict",
            params={"model": str(job_id)},
            files={"files": ("x.png", images.flat_png(200), "image/png")},
        )
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["results"][0]["top_k"]) == 5
        mark("predicted on the API host")

    # Each host wrote only under its own folders: the API fetched into its cache, A kept
    # the copy it was killed with, B removed its copy once the job ended (all is in the
    # bucket).
    assert not (roots["api"] / "artifacts" / "jobs" / str(job_id)).exists()
    assert any(path.is_file() for path in (roots["api"] / "cache").rglob("*"))
    assert any((roots["a"] / "artifacts").rglob("*.pt"))
    assert not (roots["b"] / "artifacts" / "jobs" / str(job_id)).exists()
    print("\n" + "\n".join(timeline))
