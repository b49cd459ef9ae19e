"""The HTTP API under a realistic database: submissions, the filtered list, long curves.

Seeds a fresh Postgres database (`resnet_bench_<random>`, dropped at the end) through the
migrations with 10,000 jobs and 5,000,000 metric points (COPY), of which one job holds
500,000 (five series of 100,000 steps). Then serves the API with uvicorn in a subprocess
(auth off, one worker, broker: a Redis database of its own, flushed at the end) and times,
with one httpx client, after a warm-up:

- submission: POST /jobs, one at a time: p50 / p99 and jobs/s;
- the filtered list: GET /jobs?status=succeeded&model=resnet56&sort=-created (50 a page),
  and with a spec-path filter (model.options.unit=full_preact), a summary comparison
  (best_test_error<0.08) and a sort by a summary JSON key (-summary.best_train_error);
- curves: GET /jobs/{id}/metrics?max_points=2000 of the 500,000-point job, both as a
  repeated request (served from the API's cache of a job's curves per version) and
  uncached (each request with another max_points, 2000..2000+N, so each is computed).

The baseline, in the same run: the list (each search too) and the curves queries alone
(`core.job_queries`, the code the routes call), timed with SQLAlchemy in this process, next to
the HTTP figures.

    .venv/bin/python -m bench.api_load
    .venv/bin/python -m bench.api_load --jobs 2000 --points 500000 --requests 50   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import redis

from api.schemas import JobQuery
from client.filters import JobFilter
from client.wire import FINAL_STATUSES
from core import job_queries
from core.db import schema
from core.db.session import session_scope
from core.kinds import TrainJobSpec
from tests.services import REDIS_URL, free_port, throwaway_database

MODELS = (
    *(
        "resnet18",
        "resnet20",
        "resnet32",
        "resnet44",
        "resnet56",
        "resnet110",
        "plain20",
        "plain56",
    ),
    *("preact_resnet110", "preact_resnet164"),
)
DATASETS = ("cifar10", "cifar10", "cifar10", "cifar100", "digits", "mnist")
STATUSES = ("succeeded",) * 14 + ("failed", "failed", "cancelled", "running", "queued", "queued")
SERIES = ("train/loss", "train/error", "lr", "images_per_s", "test/error")
BIG_JOB_POINTS = 500_000
LIST_QUERY = {"status": "succeeded", "model": "resnet56", "sort": "-created"}
SEARCHES = {
    "list spec path": {"filter": "model.options.unit=full_preact"},
    "list metric": {"filter": "best_test_error<0.08"},
    "list summary sort": {"status": "succeeded", "sort": "-summary.best_train_error"},
}
UNITS = ("original", "full_preact", None)  # None: the family's default, not in the spec
LRS = (0.1, 0.1, 0.05, 0.2, 0.01)
GOALS_MS = {"submission": 20.0, "list": 50.0, "curves": 100.0, "curves uncached": 100.0}
GOALS_MS |= dict.fromkeys(SEARCHES, 50.0)


@dataclass(frozen=True)
class Seeded:
    """What the timings need from the seeded database."""

    url: str
    big_job: uuid.UUID


@contextmanager
def bench_database() -> Iterator[str]:
    """A new, migrated database (`resnet_bench_<random>`) that is dropped afterwards."""
    with throwaway_database("resnet_bench") as url:
        schema.upgrade(url)
        yield url


def _spec_json(model: str, dataset: str, unit: str | None = None, lr: float = 0.1) -> str:
    options = {"unit": unit} if unit and not model.startswith("plain") else {}
    spec = {
        "model": {"name": model, "options": options},
        "dataset": {"name": dataset},
        "recipe": {"epochs": 30, "lr": lr},
    }
    return TrainJobSpec.model_validate(spec).model_dump_json()


def _summary(rng: random.Random, best: float) -> str:
    """A succeeded run's summary JSON: the columns' values and keys only the JSON holds."""
    summary = {
        "best_test_error": best,
        "final_test_error": round(best + rng.uniform(0, 0.01), 4),
        "best_train_error": round(rng.uniform(0, 0.1), 4),
        "final_train_loss": round(rng.uniform(0.001, 0.5), 4),
        "params": rng.choice((272_474, 855_770, 1_727_962)),
        "wall_time_s": round(rng.uniform(60, 20_000), 1),
        "images_per_s": round(rng.uniform(500, 20_000), 1),
    }
    return json.dumps(summary).replace("\\", "\\\\")


def _job_lines(count: int, rng: random.Random) -> Iterator[tuple[uuid.UUID, str, str]]:
    """(id, status, COPY line) of `count` jobs, created over the last 90 days."""
    specs: dict[tuple[str, str, str | None, float], str] = {}
    now = datetime.now(UTC)
    for index in range(count):
        model, dataset, status = rng.choice(MODELS), rng.choice(DATASETS), rng.choice(STATUSES)
        unit, lr = rng.choice(UNITS), rng.choice(LRS)
        if (model, dataset, unit, lr) not in specs:
            specs[model, dataset, unit, lr] = _spec_json(model, dataset, unit, lr)
        created = now - timedelta(days=90 * (1 - index / count), seconds=rng.random())
        final = status in FINAL_STATUSES
        finished = (created + timedelta(hours=rng.uniform(0.1, 12))).isoformat() if final else r"\N"
        best = round(rng.uniform(0.04, 0.3), 4)
        summary = _summary(rng, best) if status == "succeeded" else r"\N"
        family = "preact_resnet" if model.startswith("preact") else model.rstrip("0123456789")
        depth = model.removeprefix(family)
        job_id = uuid.UUID(int=rng.getrandbits(128), version=4)
        name = f"{model} on {dataset} #{index}"
        spec = specs[model, dataset, unit, lr].replace("\\", "\\\\")
        fields = (
            *(job_id, "train", status, name, '["bench"]', spec, model, family, depth, dataset),
            *(1, 3, 1, False, 0, best if status == "succeeded" else r"\N", summary),
            *(created.isoformat(), finished, created.isoformat()),
        )
        yield job_id, status, "\t".join(map(str, fields)) + "\n"


JOB_COLUMNS = (
    "id, kind, status, name, tags, spec, model_name, model_family, depth, dataset_name, "
    "attempt, max_attempts, fencing_token, cancel_requested, step, best_test_error, summary, "
    "created_at, finished_at, updated_at"
)


def _metric_lines(job_id: uuid.UUID, steps: int, stamp: str) -> Iterator[str]:
    """COPY lines of the five series of one job, `steps` points each."""
    for name in SERIES:
        for step in range(1, steps + 1):
            yield f"{job_id}\t{name}\t{step}\t{1.0 / (1 + step * 1e-3):.6f}\t\\N\t{stamp}\n"


def _copy(connection: psycopg.Connection, statement: str, lines: Iterator[str]) -> None:
    """COPY lines in blocks of about 4 MB."""
    with connection.cursor() as cursor, cursor.copy(statement) as copy:
        block: list[str] = []
        for line in lines:
            block.append(line)
            if len(block) == 50_000:
                copy.write("".join(block))
                block.clear()
        copy.write("".join(block))


def seed(url: str, jobs: int, points: int) -> Seeded:
    """Jobs and metric points, with COPY; the first job that ran gets 500,000 points."""
    rng = random.Random(0)
    made = list(_job_lines(jobs, rng))
    ran = [job_id for job_id, status, _ in made if status not in ("queued",)]
    big, rest = ran[0], ran[1:]
    per_job = max(1, (points - BIG_JOB_POINTS) // (len(SERIES) * len(rest)))
    stamp = datetime.now(UTC).isoformat()
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as connection:
        _copy(connection, f"COPY job ({JOB_COLUMNS}) FROM STDIN", (line for *_, line in made))
        metric = "COPY metric (job_id, name, step, value, epoch, created_at) FROM STDIN"
        lines = _metric_lines(big, BIG_JOB_POINTS // len(SERIES), stamp)
        _copy(connection, metric, lines)
        _copy(connection, metric, (ln for j in rest for ln in _metric_lines(j, per_job, stamp)))
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE")  # what autovacuum does after a bulk load
    return Seeded(url, big)


@contextmanager
def own_redis_db() -> Iterator[str]:
    """An empty Redis database of this run, flushed at the end."""
    for number in range(15, 0, -1):
        client = redis.Redis.from_url(f"{REDIS_URL}/{number}")
        if client.dbsize() == 0 and client.set("resnet-bench-claim", "1", nx=True, ex=3600):
            try:
                yield f"{REDIS_URL}/{number}"
            finally:
                client.flushdb()
                client.close()
            return
    raise RuntimeError("no empty Redis database 1..15")


@contextmanager
def api_server(database_url: str, broker_url: str) -> Iterator[str]:
    """uvicorn serving `api.app:create_app` in a subprocess, auth off; its base URL."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="resnet-bench-"))
    env = os.environ | {
        "DATABASE_URL": database_url,
        "BROKER_URL": broker_url,
        "AUTH_ENABLED": "false",
        "RATE_LIMIT_SUBMITS_PER_MINUTE": "0",  # the timed submissions are a burst on purpose
        "ARTIFACT_DIR": str(folder / "artifacts"),
        "DATA_DIR": str(folder / "data"),
    }
    command = [sys.executable, "-m", "uvicorn", "--factory", "api.app:create_app"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(command, env=env)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        _wait_until_up(base, server)
        yield base
    finally:
        server.terminate()
        server.wait(30)


def _wait_until_up(base: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the API exited with {server.returncode}")
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("the API did not start within 60 s")


def timed(call: Callable[[], object], repeats: int, warm_up: int = 5) -> list[float]:
    """Milliseconds of each of `repeats` calls, after `warm_up` untimed ones."""
    for _ in range(warm_up):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def percentile(times: list[float], q: float) -> float:
    """The q-th percentile (0..100) of `times`."""
    return statistics.quantiles(times, n=100, method="inclusive")[round(q) - 1]


def _ok(response: httpx.Response, status: int) -> httpx.Response:
    if response.status_code != status:
        raise RuntimeError(f"{response.request.url}: HTTP {response.status_code} {response.text}")
    return response


def measure(seeded: Seeded, base: str, repeats: int) -> dict[str, list[float]]:
    """HTTP and bare-query timings of the three measures."""
    body = json.loads(_spec_json("resnet20", "digits")) | {"kind": "train"}
    curves = f"{base}/jobs/{seeded.big_job}/metrics"
    widths = iter(range(2001, 2001 + repeats + 10))  # a new cache key each time
    with httpx.Client(timeout=60) as client:
        _ok(client.get(f"{base}/models"), 200)  # waits out the zoo's warm-up in the server
        points = _ok(client.get(curves, params={"max_points": 2000}), 200).json()["series"]
        print(f"curves: {len(points)} series of {len(points['lr']['steps'])} points each")
        results = {
            "submission": timed(lambda: _ok(client.post(f"{base}/jobs", json=body), 202), repeats),
            "list": timed(lambda: _ok(client.get(f"{base}/jobs", params=LIST_QUERY), 200), repeats),
            **{
                name: timed(_lister(client, base, query), repeats)
                for name, query in SEARCHES.items()
            },
            "curves": timed(lambda: client.get(curves, params={"max_points": 2000}), repeats),
            "curves uncached": timed(
                lambda: _ok(client.get(curves, params={"max_points": next(widths)}), 200), repeats
            ),
        }
    filters = JobFilter(status=["succeeded"], model="resnet56")

    def bare_list() -> None:
        with session_scope(seeded.url) as session:
            job_queries.list_jobs(session=session, filters=filters, limit=50)

    def bare_curves() -> None:
        with session_scope(seeded.url) as session:
            job_queries.metric_series(
                session=session, job_id=seeded.big_job, names=[], max_points=2000
            )

    results["list (query)"] = timed(bare_list, repeats)
    for name, query in SEARCHES.items():
        results[f"{name} (query)"] = timed(_bare_search(seeded.url, query), repeats)
    results["curves (query)"] = timed(bare_curves, repeats)
    return results


def _bare_search(url: str, query: dict[str, str]) -> Callable[[], object]:
    """The list query of a search alone, as the route runs it (`core.job_queries`)."""
    listed = {"status", "filter", "tag"}  # repeatable in a query string
    params = JobQuery.model_validate({k: [v] if k in listed else v for k, v in query.items()})
    filters = JobFilter(status=params.status, filter=params.filter, sort=params.sort)

    def call() -> object:
        with session_scope(url) as session:
            return job_queries.list_jobs(session=session, filters=filters, limit=50)

    return call


def _lister(client: httpx.Client, base: str, query: dict[str, str]) -> Callable[[], object]:
    """A call of the list with `query` that fails on an error or an empty page."""

    def call() -> object:
        page = _ok(client.get(f"{base}/jobs", params=query), 200).json()
        if not page["items"]:
            raise RuntimeError(f"GET /jobs {query}: no job matches; the seed lacks variety")
        return page

    return call


def report(results: dict[str, list[float]], repeats: int) -> None:
    """A table of p50 / p95 / p99 per measure, with the goals."""
    print(f"\n{'measure':<27}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}  goal")
    for name, times in results.items():
        p50, p95, p99 = (percentile(times, q) for q in (50, 95, 99))
        goal = ""
        if name in GOALS_MS:
            which, value = ("p99", p99) if name == "submission" else ("p95", p95)
            verdict = "met" if value < GOALS_MS[name] else "MISSED"
            goal = f"{which} < {GOALS_MS[name]:.0f} ms: {verdict}"
        print(f"{name:<27}{p50:>9.2f}{p95:>9.2f}{p99:>9.2f}  {goal}")
    submissions = results["submission"]
    print(f"\nsubmission: {1000 * repeats / sum(submissions):.0f} jobs/s, one client in sequence")
    for name, query in (("list", "list"), ("curves uncached", "curves")):
        ratio = percentile(results[name], 50) / percentile(results[f"{query} (query)"], 50)
        print(f"{name}: HTTP p50 is {ratio:.2f}x the bare query's")
    print(f"load average during the run: {os.getloadavg()[0]:.2f} (2 cores; others share them)")


def main() -> None:
    """Seed, serve, time, report; the database and the Redis db are removed at the end."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--points", type=int, default=5_000_000)
    parser.add_argument("--requests", type=int, default=300, help="Timed requests per measure.")
    args = parser.parse_args()
    with bench_database() as url, own_redis_db() as broker_url:
        started = time.perf_counter()
        seeded = seed(url, args.jobs, args.points)
        took = time.perf_counter() - started
        print(f"seeded {args.jobs:,} jobs, {args.points:,} points in {took:.0f} s")
        with api_server(url, broker_url) as base:
            results = measure(seeded, base, args.requests)
    report(results, args.requests)


if __name__ == "__main__":
    main()
