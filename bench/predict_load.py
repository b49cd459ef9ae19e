"""POST /predict under load: micro-batching against the bare model and against no batching.

Makes a ResNet-20 checkpoint (one training step on synthetic 32x32 data, written to a
temporary artifact store), records it as a succeeded job of a fresh Postgres database
(`resnet_bench_<random>`, dropped at the end) and registers it as `bench`. Then, for
micro-batching on (PREDICT_MAX_BATCH=64) and off (=1), serves the API with uvicorn in a
subprocess (auth off unless --auth; one API process, the model in a process of its own)
and sends single-image 32x32 PNG requests with wrk (a Lua script builds the multipart
body) at concurrency 1, 8 and 64, reading requests/s and p50/p99 latency from wrk. In the same
run, the baseline: the bare model's forward pass (`Predictor.probabilities` on every
core, batches under 8 on one) at batch 1, 64 and the batch sizes micro-batching formed
(from GET /predict/stats), in this process with nothing else running: for the net as
served (its serving form, batch norms folded, unless --no-fold) and the net as trained
(eager).

    apt-get install -y wrk
    .venv/bin/python -m bench.predict_load
    .venv/bin/python -m bench.predict_load --seconds 5     # quicker
    .venv/bin/python -m bench.predict_load --replicas 2 --threads 1
    .venv/bin/python -m bench.predict_load --auth          # every request with an API key
    .venv/bin/python -m bench.predict_load --no-fold       # serve the eager net
    .venv/bin/python -m bench.predict_load --backend torch # PREDICT_BACKEND (default auto)
    .venv/bin/python -m bench.predict_load --overload      # offer twice the capacity

With --overload it measures admission instead: the capacity (served req/s with wrk at
PREDICT_QUEUE_SIZE connections, `--queue`), then offers twice that rate open-loop (requests
sent on schedule whatever the answers, from an asyncio client in this process) and
reports the req/s served, the share of 503s, p50/p99 latency of the served and of the
503s (from each request's scheduled time), and the API process's resident memory before
and after.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np
import torch
from PIL import Image

from api.model_process import BACKENDS, backend_for, forward_for
from bench.api_load import bench_database, own_redis_db
from core import jobs, keys, model_registry
from core.db.session import get_engine, session_scope
from core.kinds import TrainJobSpec
from tests.services import free_port
from training import checkpoints
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.predictor import Predictor
from training.specs import TrainSpec

CONCURRENCY = (1, 8, 64)
START_TIMEOUT_S = 180  # the API's start (schema check, zoo warm-up) on a busy machine
SPEC = {
    "model": {"name": "resnet20"},
    "dataset": {"name": "synthetic", "image_size": 32, "train_size": 64, "test_size": 16},
    "recipe": {"iterations": 1, "batch_size": 32},
}
# The service's serving targets on this 2-core CPU.
GOAL_OF_BARE = 0.6  # c64 throughput / bare batched forward throughput
GOAL_OVER_UNBATCHED = 5.0  # c64 throughput / unbatched endpoint's at c64
GOAL_C1_OVER_BARE_MS = 3.0  # c1 p50 - bare batch-1 forward
GOAL_C64_P99_MS = 150.0

LUA = """
local boundary = "benchboundary"
local file = io.open("{png}", "rb")
local image = file:read("*a")
file:close()
wrk.method = "POST"
wrk.headers["Content-Type"] = "multipart/form-data; boundary=" .. boundary
wrk.body = "--" .. boundary .. "\\r\\n"
  .. 'Content-Disposition: form-data; name="files"; filename="x.png"\\r\\n'
  .. "Content-Type: image/png\\r\\n\\r\\n" .. image .. "\\r\\n--" .. boundary .. "--\\r\\n"
"""


@dataclass(frozen=True)
class Load:
    """One wrk run: requests/s, latency percentiles (ms), failed answers, batches formed."""

    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    failed: int
    batches: Counter[int] = field(default_factory=Counter)  # forward passes per batch size

    @property
    def mean_batch(self) -> float:
        """Images per forward pass during the run."""
        passes = sum(self.batches.values())
        return sum(size * n for size, n in self.batches.items()) / max(1, passes)


def make_checkpoint(url: str, artifacts: Path) -> None:
    """A ResNet-20 checkpoint of a succeeded job, registered as `bench` (version 1)."""
    spec = TrainJobSpec.model_validate({**SPEC, "kind": "train"})
    with session_scope(url) as session:
        job_id = jobs.create(session=session, spec=spec, max_attempts=1).id
    with session_scope(url) as session:
        held = jobs.claim(
            session=session, job_id=job_id, worker="bench", device="cpu", lease_seconds=600
        )
    assert held is not None
    out = artifacts / "jobs" / str(job_id)
    train = TrainSpec.model_validate(SPEC)
    fit(train, load_dataset(train.dataset, data_root=out), out_dir=out, sink=RecordingSink())
    best = out / "checkpoints" / checkpoints.BEST
    with session_scope(url) as session:
        jobs.record_checkpoint(
            session=session,
            job_id=job_id,
            token=held.token,
            step=1,
            epoch=1,
            path=str(best),
            sha256=checkpoints.sha256_of(best),
            size=best.stat().st_size,
            is_best=True,
            kept=[str(best)],
        )
        jobs.finish(session=session, job_id=job_id, token=held.token, status="succeeded")
    with session_scope(url) as session:
        model_registry.register(session=session, name="bench", job_id=job_id)


def sample_png(folder: Path) -> Path:
    """A 32x32 RGB noise PNG, the request body's image."""
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="RGB").save(buffer, format="PNG")
    path = folder / "x.png"
    path.write_bytes(buffer.getvalue())
    return path


@contextmanager
def api_server(
    env: dict[str, str], headers: dict[str, str], pids: list[int] | None = None
) -> Iterator[str]:
    """uvicorn serving the API in a subprocess; its base URL once the zoo is described.

    `pids` receives the server's process id.
    """
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "--factory", "api.app:create_app"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    command += ["--no-access-log"]
    server = subprocess.Popen(command, env=os.environ | env)
    if pids is not None:
        pids.append(server.pid)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the API exited with {server.returncode}")
            try:
                # It answers after the warm-up (the zoo described).
                httpx.get(f"{base}/models", headers=headers, timeout=60).raise_for_status()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no API within {START_TIMEOUT_S} s") from None
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        server.wait(30)


def wrk(url: str, script: Path, concurrency: int, seconds: int) -> Load:
    """Run wrk with one thread at `concurrency` connections and parse its report."""
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "--latency", "-s", str(script)]
    output = subprocess.run([*command, url], check=True, capture_output=True, text=True).stdout
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    return Load(
        concurrency,
        float(_find(r"Requests/sec:\s+([\d.]+)", output)),
        _ms(_find(r"\s50%\s+([\d.]+\w+)", output)),
        _ms(_find(r"\s99%\s+([\d.]+\w+)", output)),
        (int(failed[1]) if failed else 0) + (sum(map(int, errors.groups())) if errors else 0),
    )


def _find(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    if found is None:
        raise RuntimeError(f"wrk's report has no {pattern!r}:\n{text}")
    return found[1]


def _ms(value: str) -> float:
    """A wrk duration (850.00us, 1.20ms, 2.01s) in milliseconds."""
    number, unit = re.fullmatch(r"([\d.]+)(\w+)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def serve_and_load(
    env: dict[str, str], headers: dict[str, str], script: Path, png: Path, seconds: int
) -> list[Load]:
    """Serve with `env` and load it at each concurrency, noting the batches each run formed."""
    with api_server(env, headers) as base:
        url = f"{base}/predict?model=bench@production&top_k=5"
        # The first request starts the model's process (seconds): before any timed run.
        files = [("files", ("x.png", png.read_bytes(), "image/png"))]
        httpx.post(url, files=files, headers=headers, timeout=120).raise_for_status()
        wrk(url, script, 8, 2)  # warm-up
        loads = []
        for concurrency in CONCURRENCY:
            before = _batch_sizes(base, headers)
            load = wrk(url, script, concurrency, seconds)
            loads.append(replace(load, batches=_batch_sizes(base, headers) - before))
    return loads


def _batch_sizes(base: str, headers: dict[str, str]) -> Counter[int]:
    """Forward passes per batch size so far, over the loaded models (GET /predict/stats)."""
    stats = httpx.get(f"{base}/predict/stats", headers=headers).json()
    return Counter({int(k): n for m in stats["models"] for k, n in m["batch_sizes"].items()})


def formed_batch(load: Load) -> int:
    """The batch size micro-batching formed on average during a run, rounded."""
    return max(1, round(load.mean_batch))


def bare_forward(
    path: Path,
    sha256: str,
    sizes: list[int],
    *,
    fold: bool,
    backend: str = "torch",
    rounds: int = 5,
    seconds: float = 0.3,
) -> dict[int, tuple[float, float]]:
    """The bare net at each batch size: (images/s, ms per forward), best of `rounds`.

    With `fold`, the serving form the model processes run; without, the eager net.
    """
    # The best round: the figure least disturbed by whatever else shares the CPU.
    predictor = Predictor(path, sha256=sha256, fold=fold)
    forward = forward_for(predictor, backend_for(backend, "cpu"), torch.get_num_threads())
    results = {}
    for size in sizes:
        batch = torch.randint(0, 256, (size, 3, 32, 32), dtype=torch.uint8)
        for _ in range(3):
            forward(batch)
        best = float("inf")
        for _ in range(rounds):
            count, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                forward(batch)
                count += 1
            best = min(best, (time.perf_counter() - started) / count)
        results[size] = (size / best, best * 1000)
    return results


def report(
    batched: list[Load], unbatched: list[Load], bare: dict[str, dict[int, tuple[float, float]]]
) -> None:
    """The tables, and the serving targets against this run's figures.

    `bare` holds the served net's forward ("served") and, when that is the serving form,
    the eager net's ("eager") too.
    """
    print("\nPOST /predict, one 32x32 PNG per request (wrk -t1, --latency)")
    header = f"{'batching':<10}{'conc':>6}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'failed':>8}"
    print(f"{header}{'images/forward':>16}")
    for label, loads in (("on (64)", batched), ("off (1)", unbatched)):
        for load in loads:
            print(
                f"{label:<10}{load.concurrency:>6}{load.requests_per_s:>10.0f}"
                f"{load.p50_ms:>10.2f}{load.p99_ms:>10.2f}{load.failed:>8}{load.mean_batch:>16.1f}"
            )
    print("\nbare ResNet-20 forward (Predictor.probabilities, uint8 in, probabilities out)")
    print(f"{'net':<8}{'batch':>6}{'images/s':>12}{'ms/forward':>12}")
    for net, figures in bare.items():
        for size, (rate, ms) in sorted(figures.items()):
            print(f"{net:<8}{size:>6}{rate:>12.0f}{ms:>12.2f}")
    c1, c64, off64 = batched[0], batched[-1], unbatched[-1]
    typical = formed_batch(c64)
    goals = [
        (
            f"c64 req/s >= {GOAL_OF_BARE:.0%} of bare {net} at batch {size}",
            c64.requests_per_s / bare[net][size][0],
            GOAL_OF_BARE,
        )
        for net in bare
        for size in sorted({64, typical})
    ]
    goals.append(
        (
            f"c64 req/s >= {GOAL_OVER_UNBATCHED:.0f}x unbatched c64",
            c64.requests_per_s / off64.requests_per_s,
            GOAL_OVER_UNBATCHED,
        )
    )
    print("\ngoal                                                   measured     goal   met")
    for name, value, goal in goals:
        print(f"{name:<54}{value:>9.2f}{goal:>9.2f}   {'yes' if value >= goal else 'NO'}")
    over = c1.p50_ms - bare["served"][1][1]
    met = "yes" if over <= GOAL_C1_OVER_BARE_MS else "NO"
    name = "c1 p50 - bare served batch-1 forward (ms)"
    print(f"{name:<54}{over:>9.2f}{GOAL_C1_OVER_BARE_MS:>9.2f}   {met}")
    met = "yes" if c64.p99_ms < GOAL_C64_P99_MS else "NO"
    print(f"{'c64 p99 (ms)':<54}{c64.p99_ms:>9.2f}{GOAL_C64_P99_MS:>9.2f}   {met}")


@dataclass(frozen=True)
class Overload:
    """An open-loop run at `offered` req/s: what was served, refused, and the API's memory."""

    capacity: float  # served req/s at the queue's concurrency, closed loop
    offered: float
    sent: int
    served_per_s: float
    refused_share: float  # 503s among the answers
    other: int  # neither 200 nor 503 (errors, resets)
    other_kinds: str  # the client's errors by kind
    served_p50_ms: float
    served_p99_ms: float
    refused_p99_ms: float
    served_wire_p99_ms: float  # from when each request was written
    refused_wire_p50_ms: float
    refused_wire_p99_ms: float
    rss_before_mib: float
    rss_after_mib: float


def rss_mib(pid: int) -> float:
    """A process's resident memory (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def raw_request(url: str, png: Path, headers: dict[str, str]) -> bytes:
    """The bytes of one multipart POST of the PNG to `url` (HTTP/1.1, keep-alive)."""
    parts = httpx.URL(url)
    body = (
        b"--benchboundary\r\n"
        b'Content-Disposition: form-data; name="files"; filename="x.png"\r\n'
        b"Content-Type: image/png\r\n\r\n" + png.read_bytes() + b"\r\n--benchboundary--\r\n"
    )
    lines = [
        f"POST {parts.raw_path.decode()} HTTP/1.1",
        f"Host: {parts.host}:{parts.port}",
        "Content-Type: multipart/form-data; boundary=benchboundary",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _exchange(
    host: str,
    port: int,
    request: bytes,
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
) -> tuple[int, float]:
    """Send one request on an idle connection (or a new one); its status and when it went."""
    reader, writer = idle.pop() if idle else await asyncio.open_connection(host, port)
    sent = time.perf_counter()
    writer.write(request)
    status = int((await reader.readline()).split()[1])
    length, close = 0, False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
        close |= name.lower() == "connection" and "close" in value.lower()
    await reader.readexactly(length)
    if close:
        writer.close()
    else:
        idle.append((reader, writer))
    return status, sent


async def open_loop(
    url: str, request: bytes, rate: float, seconds: float, failures: Counter[str]
) -> list[tuple[int, float, float]]:
    """Send `rate` requests per second for `seconds`, each on schedule.

    Per request: its status (0: no answer, its error counted in `failures` by kind),
    seconds from its scheduled time to its answer, and seconds from when it was written
    (the client's own lag left out) to its answer.
    """
    parts = httpx.URL(url)
    host, port = parts.host, parts.port or 80
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    results: list[tuple[int, float, float]] = []

    async def one(scheduled: float) -> None:
        sent = scheduled
        try:
            status, sent = await _exchange(host, port, request, idle)
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as error:
            status = 0
            failures[type(error).__name__] += 1
        now = time.perf_counter()
        results.append((status, now - scheduled, now - sent))

    tasks = []
    start = time.perf_counter()
    for index in range(int(rate * seconds)):
        scheduled = start + index / rate
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    for _, writer in idle:
        writer.close()
    return results


def _percentile_ms(values: list[float], share: float) -> float:
    return float(np.percentile(values, share * 100)) * 1000 if values else float("nan")


def overload(
    env: dict[str, str], headers: dict[str, str], script: Path, png: Path, seconds: int, queue: int
) -> Overload:
    """Serve with a queue of `queue` requests, measure its capacity, then offer twice it."""
    pids: list[int] = []
    env = env | {"PREDICT_MAX_BATCH": "64", "PREDICT_QUEUE_SIZE": str(queue)}
    with api_server(env, headers, pids) as base:
        url = f"{base}/predict?model=bench@production&top_k=5"
        files = [("files", ("x.png", png.read_bytes(), "image/png"))]
        httpx.post(url, files=files, headers=headers, timeout=120).raise_for_status()
        wrk(url, script, queue, 2)  # warm-up
        capacity = wrk(url, script, queue, seconds).requests_per_s
        rss_before = rss_mib(pids[0])
        offered = 2 * capacity
        failures: Counter[str] = Counter()
        request = raw_request(url, png, headers)
        results = asyncio.run(open_loop(url, request, offered, seconds, failures))
        rss_after = rss_mib(pids[0])
    served = [s for status, s, _ in results if status == 200]
    refused = [s for status, s, _ in results if status == 503]
    served_wire = [s for status, _, s in results if status == 200]
    refused_wire = [s for status, _, s in results if status == 503]
    answered = len(served) + len(refused)
    return Overload(
        capacity=capacity,
        offered=offered,
        sent=len(results),
        served_per_s=len(served) / seconds,
        refused_share=len(refused) / max(1, answered),
        other=len(results) - answered,
        other_kinds=", ".join(f"{kind} {count}" for kind, count in failures.most_common()),
        served_p50_ms=_percentile_ms(served, 0.5),
        served_p99_ms=_percentile_ms(served, 0.99),
        refused_p99_ms=_percentile_ms(refused, 0.99),
        served_wire_p99_ms=_percentile_ms(served_wire, 0.99),
        refused_wire_p50_ms=_percentile_ms(refused_wire, 0.5),
        refused_wire_p99_ms=_percentile_ms(refused_wire, 0.99),
        rss_before_mib=rss_before,
        rss_after_mib=rss_after,
    )


def report_overload(run: Overload, queue: int, seconds: int) -> None:
    """The overload run's figures."""
    print(f"\nPOST /predict at twice the capacity (PREDICT_QUEUE_SIZE={queue}, {seconds} s)")
    print(f"capacity (wrk -c{queue}, served req/s)   {run.capacity:10.0f}")
    print(f"offered open-loop (req/s)              {run.offered:10.0f}   ({run.sent} sent)")
    print(f"served (req/s)                         {run.served_per_s:10.0f}")
    print(f"503 share of answers                   {run.refused_share:10.1%}")
    print(f"other answers (errors, resets)         {run.other:10d}   {run.other_kinds}")
    served = f"{run.served_p50_ms:.1f} / {run.served_p99_ms:.1f}"
    print(f"served p50 / p99 (ms)                  {served:>10}")
    print(f"503 p99 (ms)                           {run.refused_p99_ms:10.1f}")
    print(f"from the write, served p99 (ms)        {run.served_wire_p99_ms:10.1f}")
    refused = f"{run.refused_wire_p50_ms:.1f} / {run.refused_wire_p99_ms:.1f}"
    print(f"from the write, 503 p50 / p99 (ms)     {refused:>10}")
    memory = f"{run.rss_before_mib:.1f} / {run.rss_after_mib:.1f}"
    print(f"API resident memory before/after (MiB) {memory:>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="Per wrk run.")
    parser.add_argument("--replicas", type=int, default=1, help="PREDICT_REPLICAS.")
    parser.add_argument("--threads", type=int, default=0, help="PREDICT_THREADS (0: cores).")
    parser.add_argument("--auth", action="store_true", help="Serve with API keys required.")
    parser.add_argument(
        "--overload", action="store_true", help="Offer twice the capacity, open-loop."
    )
    parser.add_argument("--queue", type=int, default=64, help="PREDICT_QUEUE_SIZE (--overload).")
    parser.add_argument(
        "--no-fold", action="store_true", help="Serve the eager net: PREDICT_FOLD_BATCH_NORM=false."
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="PREDICT_BACKEND, for the served runs and the served bare forward "
        "(`python -m bench.backends` puts torch and onnxruntime side by side).",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install -y wrk")
    load_before = os.getloadavg()[0]
    folder = Path(tempfile.mkdtemp(prefix="resnet-predict-bench-"))
    artifacts = folder / "artifacts"
    try:
        with bench_database() as url, own_redis_db() as broker:
            make_checkpoint(url, artifacts)
            with session_scope(url) as session:
                model_registry.set_alias(
                    session=session, name="bench", alias="production", version=1
                )
                target = model_registry.resolve(session=session, ref="bench")
            get_engine(url).dispose()
            env = {
                "DATABASE_URL": url,
                "BROKER_URL": broker,
                "AUTH_ENABLED": str(args.auth).lower(),
                "ARTIFACT_DIR": str(artifacts),
                "DATA_DIR": str(folder / "data"),
                "PREDICT_REPLICAS": str(args.replicas),
                "PREDICT_THREADS": str(args.threads),
                "PREDICT_FOLD_BATCH_NORM": str(not args.no_fold).lower(),
                "PREDICT_BACKEND": args.backend,
            }
            png = sample_png(folder)
            script = folder / "predict.lua"
            headers = {}
            if args.auth:  # every request is checked (kept for AUTH_CACHE_SECONDS)
                with session_scope(url) as session:
                    key = keys.create_key(session=session, name="bench", scopes=["predict", "read"])
                headers = {"Authorization": f"Bearer {key[1]}"}
            lines = [f'wrk.headers["{name}"] = "{value}"' for name, value in headers.items()]
            script.write_text(LUA.replace("{png}", str(png)) + "\n".join(lines) + "\n")
            if args.overload:
                run = overload(env, headers, script, png, args.seconds, args.queue)
                report_overload(run, args.queue, args.seconds)
                load_after = os.getloadavg()[0]
                print(f"\nload average (1 min) at start {load_before:.2f}, at end {load_after:.2f}")
                return
            batched, unbatched = (
                serve_and_load(env | {"PREDICT_MAX_BATCH": n}, headers, script, png, args.seconds)
                for n in ("64", "1")
            )
            sizes = sorted({1, 64, *(formed_batch(load) for load in batched)})
            path, sha256 = Path(target.path), target.sha256
            served = bare_forward(path, sha256, sizes, fold=not args.no_fold, backend=args.backend)
            bare = {"served": served}
            if not args.no_fold:  # and the net as trained, which the targets name too
                bare["eager"] = bare_forward(path, sha256, sizes, fold=False)
        report(batched, unbatched, bare)
        # Other processes on these 2 cores skew every figure above: say how busy it was.
        print(f"\nload average (1 min) at start {load_before:.2f}, at end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
