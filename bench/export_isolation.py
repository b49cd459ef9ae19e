"""What an export costs the rest of the API: request latencies and the API's memory while
one version is exported.

Trains a tiny job of `--model` (2 steps, synthetic 32x32 images) on the embedded SQLite
database, serves the API with uvicorn in a subprocess (auth off), registers the job as a
version and, once the zoo is described, POSTs its export in `--format` while three threads
call, each one request after another: GET /healthz, GET /models (the zoo) and POST /jobs
with a net not counted yet (ResNet-20 with another shortcut scale each time: its budget is
counted on submission).
Prints each route's slowest answer during the export, the export's time, and the API
process's RSS before, at its peak and after (read from /proc).

    .venv/bin/python -m bench.export_isolation
    .venv/bin/python -m bench.export_isolation --model resnet110
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from core.db import schema
from core.settings import Settings
from tests.helpers import trained_job
from tests.services import claimed_redis_db, free_port

SAMPLE_S = 0.05


def rss_mb(pid: int) -> float:
    """The resident memory of process `pid`, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"process {pid} has no VmRSS")


@contextmanager
def api_server(settings: Settings) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """uvicorn serving `api.app:create_app` with `settings`, auth off; its base URL."""
    port = free_port()
    env = os.environ | {
        "DATABASE_URL": settings.database_url,
        "BROKER_URL": settings.broker_url,
        "AUTH_ENABLED": "false",
        "RATE_LIMIT_SUBMITS_PER_MINUTE": "0",
        "ARTIFACT_DIR": str(settings.artifact_dir),
        "DATA_DIR": str(settings.data_dir),
    }
    command = [sys.executable, "-m", "uvicorn", "--factory", "api.app:create_app"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(command, env=env)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the API did not start") from None
                time.sleep(0.1)
        yield base, server
    finally:
        server.terminate()
        server.wait(30)


def poll(call: Callable[[], httpx.Response], stop: threading.Event, out: list[float]) -> None:
    """Call `call` one request after another until `stop`, keeping each latency (s)."""
    while not stop.is_set():
        started = time.perf_counter()
        answer = call()
        out.append(time.perf_counter() - started)
        assert answer.status_code in (200, 202), answer.text
        time.sleep(SAMPLE_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--format", default="onnx")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="resnet-bench-export-"))
    url = f"sqlite:///{folder / 'resnet.db'}"
    schema.upgrade(url)
    with claimed_redis_db() as (_, broker_url):
        settings = Settings(
            database_url=url,
            broker_url=broker_url,
            artifact_dir=folder / "artifacts",
            data_dir=folder / "data",
            auth_enabled=False,
        )
        run = {
            "model": {"name": args.model},
            "dataset": {"name": "synthetic", "image_size": 32, "train_size": 32, "test_size": 8},
            "recipe": {"iterations": 2, "batch_size": 16, "checkpoint_every": 1},
        }
        job_id = trained_job(settings, run)
        with api_server(settings) as (base, server), httpx.Client(timeout=900) as client:
            made = client.post(f"{base}/registry/bench/versions", json={"job": str(job_id)})
            assert made.status_code == 201, made.text
            client.get(f"{base}/models")  # waits for the zoo's description at start
            scales = itertools.count(1)

            def submit() -> httpx.Response:
                # Another shortcut scale, another net to count: no count is cached.
                scale = 0.1 + next(scales) * 1e-6
                options = {"shortcut_variant": "constant_scaling", "shortcut_scale": scale}
                spec = {
                    "kind": "train",
                    "model": {"name": "resnet20", "options": options},
                    "dataset": {"name": "synthetic", "image_size": 32},
                    "recipe": {"iterations": 10},
                }
                return client.post(f"{base}/jobs", json=spec)

            calls = {
                "GET /healthz": lambda: client.get(f"{base}/healthz"),
                "GET /models": lambda: client.get(f"{base}/models"),
                "POST /jobs (a new net)": submit,
            }
            before = rss_mb(server.pid)
            stop = threading.Event()
            latencies: dict[str, list[float]] = {name: [] for name in calls}
            threads = [
                threading.Thread(target=poll, args=(call, stop, latencies[name]))
                for name, call in calls.items()
            ]
            for thread in threads:
                thread.start()
            peak = before
            started = time.perf_counter()
            exporting = threading.Thread(
                target=lambda: latencies.setdefault(
                    "export",
                    [
                        client.post(
                            f"{base}/registry/bench/versions/1/exports",
                            json={"format": args.format},
                        ).status_code
                    ],
                )
            )
            exporting.start()
            while exporting.is_alive():
                peak = max(peak, rss_mb(server.pid))
                time.sleep(SAMPLE_S)
            took = time.perf_counter() - started
            stop.set()
            for thread in threads:
                thread.join()
            after = rss_mb(server.pid)
    report = {
        "model": args.model,
        "format": args.format,
        "export_status": latencies.pop("export")[0],
        "export_s": round(took, 2),
        "max_latency_s": {name: round(max(values), 3) for name, values in latencies.items()},
        "requests": {name: len(values) for name, values in latencies.items()},
        "api_rss_mb": {"before": round(before), "peak": round(peak), "after": round(after)},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
