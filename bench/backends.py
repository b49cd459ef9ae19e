"""ONNX Runtime against PyTorch serving the same net: bare forward passes and served requests.

Makes the ResNet-20 checkpoint of `bench.predict_load` (one training step on synthetic
32x32 data, registered as `bench` in a fresh Postgres database, dropped at the end). Then,
for each backend (PREDICT_BACKEND=torch: the folded PyTorch net; onnxruntime: that net
exported to ONNX in memory, run by ONNX Runtime on the CPU):

- the bare forward pass in this process (`serving.process.forward_for`, uint8 images in,
  probabilities out, on the intra-op threads a model process gets) at batch 1, 8 and 64:
  ms per forward, best of 5 rounds;
- the API served by uvicorn in a subprocess (auth off, micro-batching on, one model
  process) under wrk at concurrency 1, 8 and 64, one 32x32 PNG per multipart request:
  requests/s and p50/p99 latency.

A table puts the two side by side with ratios (> 1: ONNX Runtime is faster).

    apt-get install -y wrk
    .venv/bin/python -m bench.backends
    .venv/bin/python -m bench.backends --seconds 5       # quicker
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import httpx
import torch

from bench.predict_load import Load, api_server, bench_model, best_forward_s, sample_png, wrk
from serving.process import forward_for, threads_for
from training.predictor import Predictor

BACKENDS = ("torch", "onnxruntime")
SIZES = (1, 8, 64)
CONCURRENCY = (1, 8, 64)
MULTIPART = """
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


def bare_ms(
    path: Path, sha256: str, backend: str, *, rounds: int = 5, seconds: float = 0.3
) -> dict[int, float]:
    """ms per forward pass of the served net at each of `SIZES`, best of `rounds`."""
    torch.set_num_threads(threads_for(1))  # what a model process's forward gets
    predictor = Predictor(path, sha256=sha256, fold=True)
    forward = forward_for(predictor, backend, torch.get_num_threads())
    return {
        size: best_forward_s(forward, size, rounds=rounds, seconds=seconds) * 1000 for size in SIZES
    }


def served(env: dict[str, str], script: Path, png: Path, seconds: int) -> list[Load]:
    """wrk at each concurrency against the API served with `env`."""
    with api_server(env, {}) as base:
        url = f"{base}/predict?model=bench&top_k=5"
        # The first request starts the model's process (and its export): before any timing.
        files = [("files", ("x.png", png.read_bytes(), "image/png"))]
        httpx.post(url, files=files, timeout=180).raise_for_status()
        wrk(url, script, 8, 2)  # warm-up
        return [wrk(url, script, concurrency, seconds) for concurrency in CONCURRENCY]


def report(bare: dict[str, dict[int, float]], loads: dict[str, list[Load]]) -> None:
    """The two backends side by side, with ONNX Runtime's speed over torch's."""
    torch_ms, ort_ms = bare["torch"], bare["onnxruntime"]
    print(f"\nbare forward, uint8 in, probabilities out ({threads_for(1)} intra-op threads)")
    print(f"{'batch':>5}{'torch ms':>10}{'ort ms':>10}{'torch img/s':>13}{'ort img/s':>11}{'x':>7}")
    for size in SIZES:
        print(
            f"{size:>5}{torch_ms[size]:>10.2f}{ort_ms[size]:>10.2f}"
            f"{size * 1000 / torch_ms[size]:>13.0f}{size * 1000 / ort_ms[size]:>11.0f}"
            f"{torch_ms[size] / ort_ms[size]:>7.2f}"
        )
    print("\nserved: one 32x32 PNG per multipart request (wrk -t1), micro-batching on")
    print(
        f"{'conc':>5}{'torch req/s':>13}{'ort req/s':>11}{'x':>7}"
        f"{'torch p50/p99 ms':>19}{'ort p50/p99 ms':>17}{'failed':>8}"
    )
    for ours, theirs in zip(loads["torch"], loads["onnxruntime"], strict=True):
        print(
            f"{ours.concurrency:>5}{ours.requests_per_s:>13.0f}{theirs.requests_per_s:>11.0f}"
            f"{theirs.requests_per_s / ours.requests_per_s:>7.2f}"
            f"{f'{ours.p50_ms:.1f} / {ours.p99_ms:.1f}':>19}"
            f"{f'{theirs.p50_ms:.1f} / {theirs.p99_ms:.1f}':>17}"
            f"{ours.failed + theirs.failed:>8}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="Per wrk run.")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install -y wrk")
    load_before = os.getloadavg()[0]
    with bench_model("resnet-backends-bench-") as bench:
        png = sample_png(bench.folder)
        script = bench.folder / "predict.lua"
        script.write_text(MULTIPART.replace("{png}", str(png)))
        env = bench.env() | {"PREDICT_MAX_BATCH": "64"}
        loads = {
            backend: served(env | {"PREDICT_BACKEND": backend}, script, png, args.seconds)
            for backend in BACKENDS
        }
        path, sha256 = Path(bench.target.path), bench.target.sha256
        bare = {backend: bare_ms(path, sha256, backend) for backend in BACKENDS}
    report(bare, loads)
    # Other processes on the machine skew every figure above: say how busy it was.
    print(f"\nload average (1 min) at start {load_before:.2f}, at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
