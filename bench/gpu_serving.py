"""The served net's images/s on one GPU, by precision, as one prepared script.

Trains ResNet-20 for one step on synthetic 32x32 images (nothing downloads), then serves it
as the model processes do (`training.predictor.Predictor`, batch norms folded,
channels_last) in fp32, bf16 and fp16 (PREDICT_PRECISION), each checked against fp32 on
the probe batch as a model start checks it, and times the forward pass (uint8 batch in,
probabilities out, synchronised) at batch 1, 8 and 64. Where torch_tensorrt is installed,
the folded fp32 net compiled by it as well (fp16 kernels allowed); where it is not, the
row says so. Then `/v2` req/s at concurrency 1, 8 and 64 per precision: the API under
uvicorn serving the ResNet-20 of `bench.predict_load` on the device (SQLite and the embedded
queue, since the GPU machine runs no Postgres; one 32x32 PNG per request as a v2 BYTES
element), loaded by an asyncio client of keep-alive connections in this process (wrk is
not there either). Prints the tables and writes JSON (`--json`).

    .venv/bin/python -m bench.gpu_serving --json gpu_serving.json        # on a GPU machine
    .venv/bin/python -m bench.gpu_serving --device cpu --quick           # the CPU path
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import httpx
import numpy as np
import torch
from torch import Tensor

from bench.predict_load import (
    api_server,
    exchange,
    make_checkpoint,
    raw_request,
    request_form,
    sample_png,
)
from core.db import schema
from training import checkpoints
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
from training.predictor import Precision, Predictor
from training.specs import TrainSpec

BATCHES = (1, 8, 64)
CONCURRENCY = (1, 8, 64)
PRECISIONS: tuple[Precision, ...] = get_args(Precision)


def checkpoint(folder: Path, model: str) -> Path:
    """`model` after one training step on synthetic 32x32 images."""
    spec = TrainSpec.model_validate(
        {
            "model": {"name": model},
            "dataset": {"name": "synthetic", "image_size": 32, "train_size": 64, "test_size": 8},
            "recipe": {"iterations": 1, "batch_size": 32},
        }
    )
    data = load_dataset(spec.dataset, data_root=folder)
    fit(spec, data, RunOptions(out_dir=folder, device=torch.device("cpu")), RecordingSink())
    return folder / checkpoints.DIRECTORY / checkpoints.BEST


def images_per_s(
    forward: Callable[[Tensor], Tensor], batch: Tensor, seconds: float, device: torch.device
) -> float:
    """Images/s of `forward` on `batch` over about `seconds`, after a warm-up."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):
        forward(batch)
    sync()
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or not runs:
        forward(batch)
        runs += 1
    sync()
    return runs * len(batch) / (time.perf_counter() - started)


def tensorrt_forward(predictor: Predictor) -> Callable[[Tensor], Tensor] | str:
    """The predictor's folded net compiled by torch_tensorrt, or why there is none."""
    if predictor.device.type != "cuda":
        return "TensorRT runs on a GPU"
    if importlib.util.find_spec("torch_tensorrt") is None:
        return "torch_tensorrt is not installed"
    import torch_tensorrt  # type: ignore[import-not-found]  # on GPU machines only

    shape = (1, predictor.info.channels, *predictor.preprocessing.crop)
    spec = torch_tensorrt.Input(
        min_shape=shape, opt_shape=(64, *shape[1:]), max_shape=(64, *shape[1:])
    )
    compiled = torch_tensorrt.compile(
        predictor.model, inputs=[spec], enabled_precisions={torch.float32, torch.float16}
    )

    def run(images: Tensor) -> Tensor:
        with torch.inference_mode():
            x = predictor.normalise(images.to(predictor.device))
            probabilities: Tensor = compiled(x).float().softmax(1)
            return probabilities

    return run


def measure(path: Path, device: torch.device, seconds: float) -> list[dict[str, Any]]:
    """One row per way of serving: its images/s at each batch, or why it did not run."""
    sha256 = checkpoints.sha256_of(path)
    precisions: list[Precision] = ["fp32", "bf16"]
    precisions += ["fp16"] if device.type == "cuda" else []  # fp16 convolutions crawl on CPUs
    rows: list[dict[str, Any]] = []
    fp32: Predictor | None = None
    for precision in precisions:
        served = Predictor(path, sha256=sha256, device=device, fold=True, precision=precision)
        fp32 = fp32 or served
        rows.append(_row(precision, served.probabilities, served, device, seconds))
        rows[-1]["max_abs_diff_vs_fp32"] = served.precision_diff
    assert fp32 is not None
    trt = tensorrt_forward(fp32)
    if isinstance(trt, str):
        rows.append({"serving": "tensorrt", "unavailable": trt})
    else:
        rows.append(_row("tensorrt", trt, fp32, device, seconds))
    return rows


def _row(
    name: str,
    forward: Callable[[Tensor], Tensor],
    predictor: Predictor,
    device: torch.device,
    seconds: float,
) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    shape = (predictor.info.channels, *predictor.preprocessing.crop)
    figures = {}
    for size in BATCHES:
        batch = torch.randint(0, 256, (size, *shape), dtype=torch.uint8, generator=generator)
        figures[str(size)] = round(images_per_s(forward, batch, seconds, device), 1)
    return {"serving": name, "images_per_s": figures}


def served_v2(
    device: torch.device, precisions: list[Precision], seconds: float
) -> list[dict[str, Any]]:
    """One row per precision: the API's `/v2` req/s and latency at each concurrency."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-serving-v2-") as name:
        folder = Path(name)
        url = f"sqlite:///{folder / 'bench.db'}"
        schema.upgrade(url)
        make_checkpoint(url, folder / "artifacts")
        form = request_form("v2", sample_png(folder).read_bytes())
        env = {
            "DATABASE_URL": url,
            "BROKER_URL": f"sqla+sqlite:///{folder / 'broker.db'}",
            "AUTH_ENABLED": "false",
            "ARTIFACT_DIR": str(folder / "artifacts"),
            "DATA_DIR": str(folder / "data"),
            "PREDICT_DEVICE": str(device),
            "PREDICT_MAX_BATCH": "64",
        }
        for precision in precisions:
            with api_server(env | {"PREDICT_PRECISION": precision}, {}) as base:
                root = base.removesuffix("/api/v1")
                request = raw_request(root, form, {})
                asyncio.run(closed_loop(root, request, 8, min(seconds, 1.0)))  # starts the model
                loads = [asyncio.run(closed_loop(root, request, c, seconds)) for c in CONCURRENCY]
            rows.append({"serving": precision, "v2": loads})
    return rows


async def closed_loop(
    root: str, request: bytes, concurrency: int, seconds: float
) -> dict[str, Any]:
    """`concurrency` callers sending `request` back to back for `seconds`: req/s, latency."""
    parts = httpx.URL(root)
    latencies: list[float] = []
    failed = 0
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        nonlocal failed
        idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        while time.perf_counter() < deadline:
            status, sent = await exchange(parts.host, parts.port or 80, request, idle)
            latencies.append(time.perf_counter() - sent)
            failed += status != 200
        for _, writer in idle:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    return {
        "concurrency": concurrency,
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(float(np.percentile(latencies, 50)) * 1000, 2),
        "p99_ms": round(float(np.percentile(latencies, 99)) * 1000, 2),
        "failed": failed,
    }


def report(rows: list[dict[str, Any]], device: str, model: str) -> None:
    """The table: images/s per way of serving and batch."""
    print(f"{model} served on {device}, images/s (uint8 batch in, probabilities out)")
    print(f"{'serving':<10}" + "".join(f"{'batch ' + str(b):>12}" for b in BATCHES) + "  |p-p32|")
    for row in rows:
        if "unavailable" in row:
            print(f"{row['serving']:<10}  unavailable: {row['unavailable']}")
            continue
        speeds = "".join(f"{row['images_per_s'][str(b)]:>12.0f}" for b in BATCHES)
        print(f"{row['serving']:<10}{speeds}  {row.get('max_abs_diff_vs_fp32', 0):.1e}")


def _cell(load: dict[str, Any]) -> str:
    return f"{load['requests_per_s']:.0f} ({load['p50_ms']:.1f} / {load['p99_ms']:.1f})"


def report_v2(rows: list[dict[str, Any]], device: str) -> None:
    """The table: `/v2` req/s (p50/p99 ms) per precision and concurrency."""
    print(f"\nresnet20 behind /v2 on {device}, req/s (p50 / p99 ms), one 32x32 PNG a request")
    print(f"{'serving':<10}" + "".join(f"{'c' + str(c):>24}" for c in CONCURRENCY))
    for row in rows:
        cells = "".join(f"{_cell(load):>24}" for load in row["v2"])
        print(f"{row['serving']:<10}{cells}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--seconds", type=float, default=3.0, help="per batch size and row")
    parser.add_argument(
        "--quick", action="store_true", help="resnet8, 0.2 s per figure; /v2 in fp32 for 0.3 s"
    )
    parser.add_argument("--v2-seconds", type=float, default=5.0, help="per concurrency")
    parser.add_argument("--no-v2", action="store_true", help="leave out the /v2 req/s")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    model, seconds = ("resnet8", 0.2) if args.quick else (args.model, args.seconds)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="gpu-serving-") as folder:
        rows = measure(checkpoint(Path(folder), model), device, seconds)
    report(rows, str(device), model)
    result = {"device": str(device), "model": model, "rows": rows, "torch": torch.__version__}
    if not args.no_v2:
        precisions = [row["serving"] for row in rows if row["serving"] in PRECISIONS]
        v2_seconds = 0.3 if args.quick else args.v2_seconds
        precisions = precisions[:1] if args.quick else precisions  # quick: one server
        served = served_v2(device, precisions, v2_seconds)
        report_v2(served, str(device))
        result["v2"] = served
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
