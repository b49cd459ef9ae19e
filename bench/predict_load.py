"""Predictions under load: micro-batching against the bare model and against no batching.

Makes a ResNet-20 checkpoint (one training step on synthetic 32x32 data, written to a temporary
artifact store), records it as a succeeded job of a fresh Postgres database
(`resnet_bench_<random>`, dropped at the end) and registers it as `bench`. Then, for
micro-batching on (PREDICT_MAX_BATCH=64) and off (=1), serves the API with uvicorn in a
subprocess (auth off unless --auth; one API process, the model in a process of its own)
and sends single-image 32x32 PNG requests with wrk at concurrency 1, 8 and 64, in each
request form (`--modes`): `multipart` (POST /api/v1/predict, a multipart form), `raw`
(POST /api/v1/predict with the PNG as the body, `Content-Type: image/png`) and `v2`
(POST /v2/models/bench@production/infer, the Open Inference Protocol's binary form: a
BYTES input after the JSON header, the probabilities back as raw FP32). Per run it reads
requests/s and p50/p99 latency from wrk, and the CPU time per request of the API process
and of the model process (utime + stime from /proc/PID/stat before and after). Unbatched
(PREDICT_MAX_BATCH=1), the first mode only. In the same run, the baseline: the bare
model's forward pass (`Predictor.probabilities` on every core, batches under 8 on one)
at batch 1, 64 and the batch sizes micro-batching formed (from GET /predict/stats), in
this process with nothing else running: for the net as served (its serving form, batch
norms folded, unless --no-fold) and the net as trained (eager).

    apt-get install -y wrk
    .venv/bin/python -m bench.predict_load
    .venv/bin/python -m bench.predict_load --seconds 5     # quicker
    .venv/bin/python -m bench.predict_load --modes raw,v2  # only these request forms
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
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np
import torch
from PIL import Image

from bench.api_load import bench_database, own_redis_db
from core import jobs, keys, model_registry
from core.db.session import get_engine, session_scope
from core.kinds import TrainJobSpec
from core.settings import Settings
from serving.process import BACKENDS, backend_for, forward_for
from tests.services import free_port
from training import checkpoints
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
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

MODES = ("multipart", "raw", "v2")
# wrk sends one prepared body (a file this process writes) with these headers.
LUA = """
local file = io.open("{body}", "rb")
wrk.body = file:read("*a")
file:close()
wrk.method = "POST"
"""
BOUNDARY = "benchboundary"


@dataclass(frozen=True)
class Form:
    """One request form: its path and query (under the server's root), headers and body."""

    mode: str
    target: str
    headers: dict[str, str]
    body: bytes


def request_form(mode: str, png: bytes) -> Form:
    """The single-image request of `mode` (see MODES), as wrk and the open loop send it."""
    predict = "/api/v1/predict?model=bench@production&top_k=5"
    if mode == "multipart":
        body = (
            (
                f"--{BOUNDARY}\r\n"
                'Content-Disposition: form-data; name="files"; filename="x.png"\r\n'
                "Content-Type: image/png\r\n\r\n"
            ).encode()
            + png
            + f"\r\n--{BOUNDARY}--\r\n".encode()
        )
        content_type = f"multipart/form-data; boundary={BOUNDARY}"
        return Form(mode, predict, {"Content-Type": content_type}, body)
    if mode == "raw":
        return Form(mode, predict, {"Content-Type": "image/png"}, png)
    if mode == "v2":
        return binary_infer(mode, "/v2/models/bench@production/infer", png, shape=[1])
    raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")


def binary_infer(mode: str, target: str, png: bytes, *, shape: list[int]) -> Form:
    """An Open Inference Protocol infer in the binary form: `png` as the one BYTES element
    of an input of `shape`, the probabilities asked back as raw FP32."""
    # The BYTES element: its 4-byte little-endian length, then the file (Triton's form).
    element = len(png).to_bytes(4, "little") + png
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "IMAGE_BYTES",
                    "datatype": "BYTES",
                    "shape": shape,
                    "parameters": {"binary_data_size": len(element)},
                }
            ],
            "outputs": [{"name": "PROBABILITIES", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return Form(mode, target, headers, header + element)


def wrk_script(form: Form, folder: Path, headers: dict[str, str]) -> Path:
    """The Lua script (and its body file) that sends `form` with `headers` added."""
    body = folder / f"{form.mode}.body"
    body.write_bytes(form.body)
    lines = [
        f'wrk.headers["{name}"] = "{value}"' for name, value in (form.headers | headers).items()
    ]
    script = folder / f"{form.mode}.lua"
    script.write_text(LUA.replace("{body}", str(body)) + "\n".join(lines) + "\n")
    return script


@dataclass(frozen=True)
class Load:
    """One wrk run: requests/s, latency percentiles (ms), failed answers, batches formed,
    and the CPU time the API and the model processes spent per request."""

    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    failed: int
    requests: int = 0
    batches: Counter[int] = field(default_factory=Counter)  # forward passes per batch size
    mode: str = "multipart"
    api_cpu_ms: float = float("nan")  # per request
    model_cpu_ms: float = float("nan")  # per request, over the model's processes

    @property
    def mean_batch(self) -> float:
        """Images per forward pass during the run."""
        passes = sum(self.batches.values())
        return sum(size * n for size, n in self.batches.items()) / max(1, passes)


def make_checkpoint(url: str, artifacts: Path) -> model_registry.Resolved:
    """A ResNet-20 checkpoint of a succeeded job, registered as `bench` (version 1, aliased
    `production`); what `bench@production` resolves to, with the bench's engine disposed."""
    spec = TrainJobSpec.model_validate({**SPEC, "kind": "train"})
    with session_scope(url) as session:
        job_id = jobs.create(
            session=session, settings=Settings(database_url=url), spec=spec, max_attempts=1
        ).id
    with session_scope(url) as session:
        held = jobs.claim(
            session=session, job_id=job_id, worker="bench", device="cpu", lease_seconds=600
        )
    assert held is not None
    out = artifacts / "jobs" / str(job_id)
    train = TrainSpec.model_validate(SPEC)
    fit(train, load_dataset(train.dataset, data_root=out), RunOptions(out_dir=out), RecordingSink())
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
    with session_scope(url) as session:
        model_registry.set_alias(session=session, name="bench", alias="production", version=1)
        target = model_registry.resolve(session=session, ref="bench@production")
    get_engine(url).dispose()
    return target


@dataclass(frozen=True)
class BenchModel:
    """The served model of a bench: its folder, databases and resolved checkpoint."""

    folder: Path
    url: str
    broker: str
    target: model_registry.Resolved

    @property
    def artifacts(self) -> Path:
        """The artifact store the checkpoint is written to."""
        return self.folder / "artifacts"

    def env(self, *, auth: bool = False) -> dict[str, str]:
        """The API's environment serving this model."""
        return {
            "DATABASE_URL": self.url,
            "BROKER_URL": self.broker,
            "AUTH_ENABLED": str(auth).lower(),
            "ARTIFACT_DIR": str(self.artifacts),
            "DATA_DIR": str(self.folder / "data"),
        }

    def bearer(self) -> str:
        """A new API key's Authorization value, to predict and read."""
        with session_scope(self.url) as session:
            _, key = keys.create_key(session=session, name="bench", scopes=["predict", "read"])
        return f"Bearer {key}"


@contextmanager
def bench_model(prefix: str) -> Iterator[BenchModel]:
    """`bench@production` in a fresh bench database and Redis database, in a temporary
    folder (`prefix`); all three removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with bench_database() as url, own_redis_db() as broker:
            target = make_checkpoint(url, folder / "artifacts")
            yield BenchModel(folder, url, broker, target)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
        int(_find(r"(\d+) requests in", output)),
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
    env: dict[str, str], headers: dict[str, str], scripts: dict[str, Path], png: Path, seconds: int
) -> list[Load]:
    """Serve with `env` and load it with each mode's script at each concurrency, noting the
    batches each run formed and the CPU time each process spent."""
    pids: list[int] = []
    with api_server(env, headers, pids) as base:
        url = f"{base}/predict?model=bench@production&top_k=5"
        root = base.removesuffix("/api/v1")
        # The first request starts the model's process (seconds): before any timed run.
        files = [("files", ("x.png", png.read_bytes(), "image/png"))]
        httpx.post(url, files=files, headers=headers, timeout=120).raise_for_status()
        processes = [pids[0], *model_processes(pids[0])]
        loads = []
        for mode, script in scripts.items():
            target = request_form(mode, b"").target
            wrk(root + target, script, 8, 2)  # warm-up
            for concurrency in CONCURRENCY:
                before, cpu = _batch_sizes(base, headers), [cpu_seconds(p) for p in processes]
                load = wrk(root + target, script, concurrency, seconds)
                spent = [cpu_seconds(p) - was for p, was in zip(processes, cpu, strict=True)]
                per = 1000 / max(1, load.requests)
                loads.append(
                    replace(
                        load,
                        batches=_batch_sizes(base, headers) - before,
                        mode=mode,
                        api_cpu_ms=spent[0] * per,
                        model_cpu_ms=sum(spent[1:]) * per,
                    )
                )
    return loads


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, all threads) a process has spent so far."""
    # /proc/PID/stat: the command is in parentheses and may hold spaces; fields after it.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def model_processes(api_pid: int) -> list[int]:
    """The API process's children that serve models (`python -m serving.process`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # it exited meanwhile
        if parent == api_pid and b"serving.process" in command:
            found.append(int(entry.name))
    return found


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
    predictor = Predictor(path, sha256=sha256, fold=fold)
    forward = forward_for(predictor, backend_for(backend, "cpu"), torch.get_num_threads())
    results = {}
    for size in sizes:
        best = best_forward_s(forward, size, rounds=rounds, seconds=seconds)
        results[size] = (size / best, best * 1000)
    return results


GOAL_RAW_OF_BARE = 0.70  # raw and v2 binary c64 req/s / bare served forward at the formed batch
GOAL_MULTIPART_OF_RAW = 0.85  # multipart c64 req/s / raw body's c64 req/s


def best_forward_s(
    forward: Callable[[torch.Tensor], object], size: int, *, rounds: int, seconds: float
) -> float:
    """Seconds per forward pass of a uint8 batch of `size` 32x32 images, after three
    unmeasured: the best of `rounds` rounds of `seconds` each."""
    batch = torch.randint(0, 256, (size, 3, 32, 32), dtype=torch.uint8)
    for _ in range(3):
        forward(batch)
    best = float("inf")
    for _ in range(rounds):  # the best round: the least disturbed by the CPU's others
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            forward(batch)
            count += 1
        best = min(best, (time.perf_counter() - started) / count)
    return best


def of_bare(load: Load, bare: dict[int, tuple[float, float]]) -> float:
    """A run's req/s over the bare net's images/s at the batch size the run formed."""
    return load.requests_per_s / bare[formed_batch(load)][0]


def report(
    batched: list[Load], unbatched: list[Load], bare: dict[str, dict[int, tuple[float, float]]]
) -> None:
    """The tables, and the serving targets against this run's figures.

    `bare` holds the served net's forward ("served") and, when that is the serving form,
    the eager net's ("eager") too.
    """
    print("\nOne 32x32 PNG per request (wrk -t1, --latency); CPU ms per request by process")
    print(
        f"{'mode':<10}{'batching':<10}{'conc':>5}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'failed':>7}{'img/fwd':>8}{'of bare':>8}{'API cpu':>8}{'model cpu':>10}"
    )
    for label, loads in (("on (64)", batched), ("off (1)", unbatched)):
        for load in loads:
            print(
                f"{load.mode:<10}{label:<10}{load.concurrency:>5}{load.requests_per_s:>8.0f}"
                f"{load.p50_ms:>8.2f}{load.p99_ms:>8.2f}{load.failed:>7}{load.mean_batch:>8.1f}"
                f"{of_bare(load, bare['served']):>8.2f}{load.api_cpu_ms:>8.2f}"
                f"{load.model_cpu_ms:>10.2f}"
            )
    print("\nbare ResNet-20 forward (Predictor.probabilities, uint8 in, probabilities out)")
    print(f"{'net':<8}{'batch':>6}{'images/s':>12}{'ms/forward':>12}")
    for net, figures in bare.items():
        for size, (rate, ms) in sorted(figures.items()):
            print(f"{net:<8}{size:>6}{rate:>12.0f}{ms:>12.2f}")
    print("\ngoal                                                   measured     goal   met")
    for name, value, goal, below in goals(batched, unbatched, bare):
        met = value <= goal if below else value >= goal
        print(f"{name:<54}{value:>9.2f}{goal:>9.2f}   {'yes' if met else 'NO'}")


def goals(
    batched: list[Load], unbatched: list[Load], bare: dict[str, dict[int, tuple[float, float]]]
) -> list[tuple[str, float, float, bool]]:
    """(name, measured, goal, whether the goal is an upper bound) for this run's figures."""
    at = {(load.mode, load.concurrency): load for load in batched}
    first = batched[0].mode
    c1, c64, off64 = at[first, 1], at[first, 64], unbatched[-1]
    typical = formed_batch(c64)
    found = [
        (
            f"{first} c64 req/s >= {GOAL_OF_BARE:.0%} of bare {net} at batch {size}",
            c64.requests_per_s / bare[net][size][0],
            GOAL_OF_BARE,
            False,
        )
        for net in bare
        for size in sorted({64, typical})
    ]
    found.append(
        (
            f"{first} c64 req/s >= {GOAL_OVER_UNBATCHED:.0f}x unbatched c64",
            c64.requests_per_s / off64.requests_per_s,
            GOAL_OVER_UNBATCHED,
            False,
        )
    )
    for mode in ("raw", "v2"):
        if (mode, 64) in at:
            name = f"{mode} c64 req/s / bare served at its formed batch"
            found.append((name, of_bare(at[mode, 64], bare["served"]), GOAL_RAW_OF_BARE, False))
    if ("raw", 64) in at and ("multipart", 64) in at:
        ratio = at["multipart", 64].requests_per_s / at["raw", 64].requests_per_s
        found.append(("multipart c64 req/s / raw c64 req/s", ratio, GOAL_MULTIPART_OF_RAW, False))
    over = c1.p50_ms - bare["served"][1][1]
    found.append(
        (f"{first} c1 p50 - bare served batch-1 forward (ms)", over, GOAL_C1_OVER_BARE_MS, True)
    )
    found.append((f"{first} c64 p99 (ms)", c64.p99_ms, GOAL_C64_P99_MS, True))
    return found


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


def raw_request(root: str, form: Form, headers: dict[str, str]) -> bytes:
    """The bytes of one POST of `form` to the server at `root` (HTTP/1.1, keep-alive)."""
    parts = httpx.URL(root)
    lines = [
        f"POST {form.target} HTTP/1.1",
        f"Host: {parts.host}:{parts.port}",
        f"Content-Length: {len(form.body)}",
        *(f"{name}: {value}" for name, value in (form.headers | headers).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + form.body


async def exchange(
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
            status, sent = await exchange(host, port, request, idle)
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
    env: dict[str, str],
    headers: dict[str, str],
    form: Form,
    script: Path,
    png: Path,
    seconds: int,
    queue: int,
) -> Overload:
    """Serve with a queue of `queue` requests, measure its capacity with `form`, then offer
    twice it."""
    pids: list[int] = []
    env = env | {"PREDICT_MAX_BATCH": "64", "PREDICT_QUEUE_SIZE": str(queue)}
    with api_server(env, headers, pids) as base:
        root = base.removesuffix("/api/v1")
        url = root + form.target
        files = [("files", ("x.png", png.read_bytes(), "image/png"))]
        predict = f"{base}/predict?model=bench@production&top_k=5"
        httpx.post(predict, files=files, headers=headers, timeout=120).raise_for_status()
        wrk(url, script, queue, 2)  # warm-up
        capacity = wrk(url, script, queue, seconds).requests_per_s
        rss_before = rss_mib(pids[0])
        offered = 2 * capacity
        failures: Counter[str] = Counter()
        request = raw_request(root, form, headers)
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


def report_overload(run: Overload, mode: str, queue: int, seconds: int) -> None:
    """The overload run's figures."""
    print(f"\n{mode} at twice the capacity (PREDICT_QUEUE_SIZE={queue}, {seconds} s)")
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
    parser.add_argument(
        "--replicas", type=int, default=1, help="PREDICT_REPLICAS (0: two on 2 cores or more)."
    )
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
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"Request forms, in order, comma-separated (of {', '.join(MODES)}); --overload "
        "and the unbatched runs use the first.",
    )
    args = parser.parse_args()
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not modes or set(modes) - set(MODES):
        sys.exit(f"--modes: choose from {', '.join(MODES)}")
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install -y wrk")
    load_before = os.getloadavg()[0]
    with bench_model("resnet-predict-bench-") as bench:
        env = bench.env(auth=args.auth) | {
            "PREDICT_REPLICAS": str(args.replicas),
            "PREDICT_THREADS": str(args.threads),
            "PREDICT_FOLD_BATCH_NORM": str(not args.no_fold).lower(),
            "PREDICT_BACKEND": args.backend,
        }
        png = sample_png(bench.folder)
        # With --auth every request is checked (kept for AUTH_CACHE_SECONDS).
        headers = {"Authorization": bench.bearer()} if args.auth else {}
        forms = {mode: request_form(mode, png.read_bytes()) for mode in modes}
        scripts = {mode: wrk_script(form, bench.folder, headers) for mode, form in forms.items()}
        if args.overload:
            form, script = forms[modes[0]], scripts[modes[0]]
            run = overload(env, headers, form, script, png, args.seconds, args.queue)
            report_overload(run, modes[0], args.queue, args.seconds)
            load_after = os.getloadavg()[0]
            print(f"\nload average (1 min) at start {load_before:.2f}, at end {load_after:.2f}")
            return
        batched = serve_and_load(
            env | {"PREDICT_MAX_BATCH": "64"}, headers, scripts, png, args.seconds
        )
        first = {modes[0]: scripts[modes[0]]}
        unbatched = serve_and_load(
            env | {"PREDICT_MAX_BATCH": "1"}, headers, first, png, args.seconds
        )
        sizes = sorted({1, 64, *(formed_batch(load) for load in batched)})
        path, sha256 = Path(bench.target.path), bench.target.sha256
        served = bare_forward(path, sha256, sizes, fold=not args.no_fold, backend=args.backend)
        bare = {"served": served}
        if not args.no_fold:  # and the net as trained, which the targets name too
            bare["eager"] = bare_forward(path, sha256, sizes, fold=False)
    report(batched, unbatched, bare)
    # Other processes on these 2 cores skew every figure above: say how busy it was.
    print(f"\nload average (1 min) at start {load_before:.2f}, at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
