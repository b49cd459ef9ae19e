"""The services the tests (and the benchmarks) run against: Postgres, Redis, local servers,
worker processes."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import redis
import uvicorn
from pydantic import SecretStr
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool
from starlette.types import ASGIApp

from core.db.session import get_engine
from core.settings import Settings
from tests.helpers import wait_for

# The services CI starts (.ci/run); a test that needs one fails when it is down.
POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379"
REDIS_LOCK = "resnet-test-lock"  # marks a Redis database a test run holds
BIN = Path(sys.executable).parent  # resnet-service, moto_server
LEASE_SECONDS = 6  # a worker process's lease, short so that a lost one expires soon
HEARTBEAT_SECONDS = 1.0


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def serve(app: ASGIApp) -> Iterator[str]:
    """`app` served by uvicorn on a free port of 127.0.0.1, in a thread; its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped while starting"
        assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def claimed_redis_db() -> Iterator[tuple[redis.Redis, str]]:
    """A Redis database 1..15 that no other test run holds (a lock key marks it), flushed
    before and after; its client and URL."""
    token = uuid.uuid4().hex
    for number in random.sample(range(1, 16), 15):
        url = f"{REDIS_URL}/{number}"
        client = redis.Redis.from_url(url)
        if client.set(REDIS_LOCK, token, nx=True, ex=3600):
            try:
                client.flushdb()
                client.set(REDIS_LOCK, token, ex=3600)  # the flush took the lock too
                yield client, url
            finally:
                client.flushdb()
                client.close()
            return
        client.close()
    raise RuntimeError("every Redis database 1..15 is held by another test run")


@contextmanager
def throwaway_database(prefix: str = "resnet_test") -> Iterator[str]:
    """A new, empty Postgres database `<prefix>_<random>`; dropped afterwards, with any
    connection still open to it."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        try:
            yield url
        finally:
            get_engine(url).dispose()
            # FORCE terminates the connections others left open (a server thread, a worker).
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@contextmanager
def s3_server(host: str = "127.0.0.1") -> Iterator[str]:
    """moto's S3 server on a free port of `host`, in a subprocess; its endpoint URL. It
    fails (never skips) when the server does not start."""
    binary = shutil.which("moto_server", path=str(BIN)) or shutil.which("moto_server")
    if binary is None:
        raise RuntimeError("moto_server is not installed; pip install -e '.[dev]'")
    port = free_port()
    url = f"http://{host}:{port}"
    # Its request log goes to a file: a pipe nobody reads would fill and stall the server.
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [binary, "-H", host, "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_until_answering(url, process, log)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_until_answering(url: str, process: subprocess.Popen[bytes], log: IO[bytes]) -> None:
    """Poll `url` until a server answers over HTTP, for up to 90 s, while `process` lives."""
    deadline = time.monotonic() + 90
    while True:
        if process.poll() is not None:
            log.seek(0)
            output = log.read().decode(errors="replace")
            raise RuntimeError(f"the server at {url} exited with {process.returncode}: {output}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no server answered at {url} within 90 s") from None
            time.sleep(0.05)


def on_bucket(settings: Settings, endpoint: str, bucket: str, folder: Path) -> Settings:
    """`settings` with `bucket` of the S3 server at `endpoint` as the artifact store, and
    artifact, cache and data folders of its own under `folder` (another machine's)."""
    return settings.model_copy(
        update={
            "artifact_store": "s3",
            "s3_endpoint_url": endpoint,
            "s3_bucket": bucket,
            "s3_access_key_id": "test",
            "s3_secret_access_key": SecretStr("test"),
            "artifact_dir": folder / "artifacts",
            "artifact_cache_dir": folder / "cache",
            "data_dir": folder / "data",
        }
    )


def file_bytes(folder: Path) -> int:
    """The bytes of the files under `folder`, as find(1) reports them (not this code's walk)."""
    sizes = subprocess.run(
        ["find", str(folder), "-type", "f", "-printf", "%s\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sum(map(int, sizes))


def service_env(settings: Settings, artifacts: Path) -> dict[str, str]:
    """The environment of a worker process: the test's database, broker and a short lease."""
    return {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "BROKER_URL": settings.broker_url,
        "ARTIFACT_DIR": str(artifacts),
        "DATA_DIR": str(artifacts.parent / "data"),
        "LEASE_SECONDS": str(settings.lease_seconds),
        "HEARTBEAT_SECONDS": str(settings.heartbeat_seconds),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


class WorkerProcess:
    """`resnet-service worker` in its own process group, its output in a log file."""

    def __init__(self, name: str, env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(BIN / "resnet-service"), "worker", "--name", f"{name}@%h"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 300) -> None:
        """Wait until Celery says the worker is ready (its reaper starts then); importing
        torch at nice 19 on two busy cores can take minutes."""
        wait_for(
            lambda: "ready." in self.output() or self.process.poll() is not None,
            timeout,
            f"{self.name} to start",
        )
        assert self.process.poll() is None, f"{self.name} exited:\n{self.output()}"

    def output(self) -> str:
        """Everything the worker logged so far."""
        return self.log.read_text(errors="replace")

    def kill_all(self) -> None:
        """kill -9 the worker and its job process (the whole process group)."""
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop_warm(self, timeout: float = 60) -> int:
        """SIGTERM (a warm shutdown, as `docker compose stop`); the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        """Cold shutdown, then kill whatever is left."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=15)
        self.kill_all()


@dataclass
class Service:
    """A database, a broker, artifact storage and the worker processes serving them."""

    settings: Settings
    root: Path
    workers: dict[str, WorkerProcess] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.settings.database_url

    def start(self, *names: str) -> None:
        """Start workers (in parallel) and wait until each is ready."""
        env = service_env(self.settings, self.root / "artifacts")
        for name in names:
            self.workers[name] = WorkerProcess(name, env, self.root / f"{name}.log")
        for name in names:
            self.workers[name].wait_ready()

    def stop(self) -> None:
        """Stop every worker, killing what does not stop."""
        for worker in self.workers.values():
            worker.stop()

    def logs(self) -> str:
        """All worker output (for assertion messages)."""
        return "\n".join(f"--- {n}\n{w.output()[-3000:]}" for n, w in self.workers.items())


def make_settings(database_url: str, broker_url: str, root: Path) -> Settings:
    """The settings the tests and their workers share."""
    return Settings(
        database_url=database_url,
        broker_url=broker_url,
        artifact_dir=root / "artifacts",
        data_dir=root / "data",
        lease_seconds=LEASE_SECONDS,
        heartbeat_seconds=HEARTBEAT_SECONDS,
    )
