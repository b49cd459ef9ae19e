"""Our prediction routes beside TorchServe and Triton (PyTriton) in one run, with ratios.

Makes the ResNet-20 checkpoint of `bench.predict_load` (a fresh database, dropped at the
end), serves it with this API (as `bench.predict_load` does) and with each peer, and
sends one 32x32 PNG per request with wrk at concurrency 1, 8 and 64:

- ours: POST /api/v1/predict with the PNG as the raw body, and POST /v2/models/.../infer
  with the PNG as a BYTES input (the Open Inference Protocol's binary form);
- TorchServe: POST /predictions/resnet with the PNG as the body; the same net (batch
  norms folded, softmax included) as TorchScript, its handler decoding with Pillow;
  2 workers of 1 intra-op thread, batches of up to 64 waiting up to 5 ms;
- Triton through PyTriton: POST /v2/models/resnet/infer with the PNG as a BYTES input;
  the same net exported to ONNX and run by ONNX Runtime (1 intra-op thread per
  instance), 2 instances, dynamic batching up to 64 waiting up to 5 ms.

The peers run from another Python environment (`--peers-python`; never this service's),
made for instance with

    python3 -m venv /work/peers-venv
    /work/peers-venv/bin/pip install torch==2.14.1 torchvision==0.29.1
    /work/peers-venv/bin/pip install torchserve torch-model-archiver pyyaml \
        nvidia-pytriton onnxruntime

(`pip install -e '.[peers]'` names the same packages). TorchServe needs Java 17.

    .venv/bin/python -m bench.peers --peers-python /work/peers-venv/bin/python
    .venv/bin/python -m bench.peers --peers-python ... --seconds 5 --peers torchserve

It prints each server's req/s and p50/p99 per concurrency, ours over each peer's, and
the bare forward of the served net on this machine (batch 1 and 64), so that figures
from machines of other speeds can be compared.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from bench.predict_load import (
    CONCURRENCY,
    Form,
    bare_forward,
    bench_model,
    binary_infer,
    request_form,
    sample_png,
    serve_and_load,
    wrk,
    wrk_script,
)
from tests.services import free_port
from training import export
from training.predictor import Predictor

PEERS = ("torchserve", "triton")
# Which of our request forms each peer's is set against.
OURS_FOR = {"torchserve": "raw", "triton": "v2"}
BATCH, DELAY_MS, WORKERS = 64, 5, 2
START_TIMEOUT_S = 300


@dataclass(frozen=True)
class Figure:
    """One server's wrk run: who, in which request form, at which concurrency."""

    server: str  # ours or a peer
    form: str  # raw, v2, torchserve, triton
    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    failed: int = 0


def ratios(figures: list[Figure]) -> list[tuple[str, int, float]]:
    """(peer, concurrency, our req/s over the peer's) for each peer run that has ours, in
    our form set against it (`OURS_FOR`); nan where a run served nothing."""
    ours = {(f.form, f.concurrency): f for f in figures if f.server == "ours"}
    found = []
    for figure in figures:
        if figure.server == "ours":
            continue
        mine = ours.get((OURS_FOR[figure.server], figure.concurrency))
        if mine is None:
            continue
        ratio = mine.requests_per_s / figure.requests_per_s if figure.requests_per_s else math.nan
        found.append((figure.server, figure.concurrency, ratio))
    return found


def table(figures: list[Figure], bare: dict[int, tuple[float, float]]) -> str:
    """The report: every run, then the ratios, then the bare forward beside them."""
    lines = ["One 32x32 PNG per request (wrk -t1, --latency)"]
    lines.append(
        f"{'server':<12}{'form':<12}{'conc':>5}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'failed':>7}"
    )
    for f in figures:
        lines.append(
            f"{f.server:<12}{f.form:<12}{f.concurrency:>5}{f.requests_per_s:>9.0f}"
            f"{f.p50_ms:>9.2f}{f.p99_ms:>9.2f}{f.failed:>7}"
        )
    lines.append("")
    lines.append(f"{'ours / peer':<30}" + "".join(f"{'c' + str(c):>8}" for c in CONCURRENCY))
    by_peer: dict[str, dict[int, float]] = {}
    for peer, concurrency, ratio in ratios(figures):
        by_peer.setdefault(peer, {})[concurrency] = ratio
    for peer, row in by_peer.items():
        label = f"{OURS_FOR[peer]} vs {peer}"
        cells = "".join(f"{row.get(c, math.nan):>8.2f}" for c in CONCURRENCY)
        lines.append(f"{label:<30}{cells}")
    lines.append("")
    lines.append("bare forward of the served net on this machine, this run")
    for size, (rate, ms) in sorted(bare.items()):
        lines.append(f"batch {size:>3}: {rate:>8.0f} images/s, {ms:.2f} ms per forward")
    return "\n".join(lines)


# --- the peers' models ------------------------------------------------------------


class _Served(torch.nn.Module):
    """The served net as the peers run it: uint8 NCHW in, normalised, probabilities out."""

    def __init__(self, predictor: Predictor) -> None:
        super().__init__()
        self.net = export.with_softmax(predictor.model).to("cpu").eval()
        shape = (1, -1, 1, 1)
        self.mean = torch.nn.Parameter(
            torch.tensor(predictor.preprocessing.mean).view(shape), requires_grad=False
        )
        self.std = torch.nn.Parameter(
            torch.tensor(predictor.preprocessing.std).view(shape), requires_grad=False
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        scaled = images.float() / 255.0
        probabilities: torch.Tensor = self.net((scaled - self.mean) / self.std)
        return probabilities


def write_models(predictor: Predictor, folder: Path) -> tuple[Path, Path]:
    """The served net as TorchScript (TorchServe's) and as an ONNX graph (Triton's)."""
    served = _Served(predictor).eval()
    example = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    scripted = folder / "resnet.pt"
    with torch.no_grad():
        torch.jit.trace(served, example).save(str(scripted))
    graph = folder / "resnet.onnx"
    graph.write_bytes(export.onnx_bytes(served, example))
    return scripted, graph


HANDLER = """
import io
import numpy as np
import torch
from PIL import Image
from ts.torch_handler.base_handler import BaseHandler


class Handler(BaseHandler):
    def preprocess(self, data):
        images = []
        for row in data:
            body = row.get("data") or row.get("body")
            image = Image.open(io.BytesIO(body)).convert("RGB")
            images.append(np.asarray(image, dtype=np.uint8).transpose(2, 0, 1))
        return torch.from_numpy(np.stack(images))

    def inference(self, data, *args, **kwargs):
        with torch.inference_mode():
            return self.model(data)

    def postprocess(self, data):
        return data.tolist()
"""

TRITON = """
import io
import sys

import numpy as np
import onnxruntime as ort
from PIL import Image
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

graph = sys.argv[1]
port, instances, most, delay_ms = (int(value) for value in sys.argv[2:6])


def instance():
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    @batch
    def infer(IMAGE_BYTES):
        images = [
            np.asarray(Image.open(io.BytesIO(row[0])).convert("RGB"), dtype=np.uint8)
            for row in IMAGE_BYTES
        ]
        batch_ = np.ascontiguousarray(np.stack(images).transpose(0, 3, 1, 2))
        return {"PROBABILITIES": session.run(None, {name: batch_})[0]}

    return infer


config = TritonConfig(http_port=port, grpc_port=port + 1, metrics_port=port + 2)
with Triton(config=config) as triton:
    triton.bind(
        model_name="resnet",
        infer_func=[instance() for _ in range(instances)],
        inputs=[Tensor(name="IMAGE_BYTES", dtype=np.bytes_, shape=(1,))],
        outputs=[Tensor(name="PROBABILITIES", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(
            max_batch_size=most,
            batcher=DynamicBatcher(max_queue_delay_microseconds=delay_ms * 1000),
        ),
    )
    triton.serve()
"""


def triton_form(png: bytes) -> Form:
    """The Triton request: a BYTES input [1, 1] (its batch dimension, then the element)."""
    return binary_infer("triton", "/v2/models/resnet/infer", png, shape=[1, 1])


def _ready(url: str, process: subprocess.Popen[bytes], form: Form, what: str) -> None:
    """Wait until `url` answers `form` with 200, or fail if the process exits first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            answer = httpx.post(url, content=form.body, headers=form.headers, timeout=30)
            if answer.status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer within {START_TIMEOUT_S} s")
        time.sleep(0.5)


def _bin(python: Path, name: str) -> str:
    return str(python.parent / name)


@contextmanager
def torchserve(python: Path, scripted: Path, folder: Path, png: bytes) -> Iterator[str]:
    """TorchServe serving the TorchScript net; its base URL once it answers."""
    store = folder / "model-store"
    store.mkdir()
    handler = folder / "handler.py"
    handler.write_text(HANDLER)
    archive = [_bin(python, "torch-model-archiver"), "--model-name", "resnet", "--version", "1"]
    archive += ["--serialized-file", str(scripted), "--handler", str(handler)]
    subprocess.run([*archive, "--export-path", str(store), "--force"], check=True)
    port, management, metrics = free_port(), free_port(), free_port()
    models = {
        "resnet": {
            "1": {
                "defaultVersion": True,
                "marName": "resnet.mar",
                "minWorkers": WORKERS,
                "maxWorkers": WORKERS,
                "batchSize": BATCH,
                "maxBatchDelay": DELAY_MS,
            }
        }
    }
    config = folder / "config.properties"
    config.write_text(
        f"inference_address=http://127.0.0.1:{port}\n"
        f"management_address=http://127.0.0.1:{management}\n"
        f"metrics_address=http://127.0.0.1:{metrics}\n"
        "disable_token_authorization=true\n"
        "load_models=resnet.mar\n"
        f"models={json.dumps(models)}\n"
    )
    env = os.environ | {"OMP_NUM_THREADS": "1", "PATH": f"{python.parent}:{os.environ['PATH']}"}
    command = [_bin(python, "torchserve"), "--start", "--foreground", "--ncs"]
    command += ["--model-store", str(store), "--ts-config", str(config), "--disable-token-auth"]
    server = subprocess.Popen(command, env=env, cwd=folder)
    base = f"http://127.0.0.1:{port}"
    try:
        form = Form("torchserve", "/predictions/resnet", {"Content-Type": "image/png"}, png)
        _ready(base + form.target, server, form, "TorchServe")
        yield base
    finally:
        subprocess.run([_bin(python, "torchserve"), "--stop"], env=env, check=False)
        _end(server)


@contextmanager
def triton(python: Path, graph: Path, folder: Path, png: bytes) -> Iterator[str]:
    """PyTriton serving the ONNX graph with ONNX Runtime; its base URL once it answers."""
    script = folder / "triton_server.py"
    script.write_text(TRITON)
    port = free_port()
    command = [str(python), str(script), str(graph), str(port), str(WORKERS), str(BATCH)]
    server = subprocess.Popen([*command, str(DELAY_MS)], cwd=folder)
    base = f"http://127.0.0.1:{port}"
    try:
        form = triton_form(png)
        _ready(base + form.target, server, form, "PyTriton")
        yield base
    finally:
        _end(server)


def _end(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def load_peer(base: str, form: Form, folder: Path, seconds: int) -> list[Figure]:
    """wrk against a peer at each concurrency (after a warm-up)."""
    script = wrk_script(form, folder, {})
    wrk(base + form.target, script, 8, 2)
    figures = []
    for concurrency in CONCURRENCY:
        run = wrk(base + form.target, script, concurrency, seconds)
        figures.append(
            Figure(
                form.mode,
                form.mode,
                concurrency,
                run.requests_per_s,
                run.p50_ms,
                run.p99_ms,
                run.failed,
            )
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--peers-python",
        type=Path,
        required=True,
        help="The Python of the environment TorchServe and PyTriton are installed in.",
    )
    parser.add_argument("--seconds", type=int, default=10, help="Per wrk run.")
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="Comma-separated: torchserve, triton."
    )
    parser.add_argument("--replicas", type=int, default=0, help="PREDICT_REPLICAS (0: default).")
    parser.add_argument("--threads", type=int, default=0, help="PREDICT_THREADS.")
    args = parser.parse_args()
    peers = [peer.strip() for peer in args.peers.split(",") if peer.strip()]
    if set(peers) - set(PEERS):
        sys.exit(f"--peers: choose from {', '.join(PEERS)}")
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: apt-get install -y wrk")
    if not args.peers_python.exists():
        sys.exit(f"--peers-python: no {args.peers_python}")
    figures: list[Figure] = []
    with bench_model("resnet-peers-bench-") as bench:
        env = bench.env() | {
            "PREDICT_THREADS": str(args.threads),
            "PREDICT_MAX_BATCH": str(BATCH),
        }
        if args.replicas:
            env["PREDICT_REPLICAS"] = str(args.replicas)
        folder, target = bench.folder, bench.target
        png_path = sample_png(folder)
        png = png_path.read_bytes()
        modes = sorted({OURS_FOR[peer] for peer in peers})
        scripts = {mode: wrk_script(request_form(mode, png), folder, {}) for mode in modes}
        for run in serve_and_load(env, {}, scripts, png_path, args.seconds):
            figures.append(
                Figure(
                    "ours",
                    run.mode,
                    run.concurrency,
                    run.requests_per_s,
                    run.p50_ms,
                    run.p99_ms,
                    run.failed,
                )
            )
        predictor = Predictor(Path(target.path), sha256=target.sha256, fold=True)
        scripted, graph = write_models(predictor, folder)
        starts = {
            "torchserve": lambda: torchserve(args.peers_python, scripted, folder, png),
            "triton": lambda: triton(args.peers_python, graph, folder, png),
        }
        forms = {
            "torchserve": Form(
                "torchserve", "/predictions/resnet", {"Content-Type": "image/png"}, png
            ),
            "triton": triton_form(png),
        }
        for peer in peers:
            try:
                with starts[peer]() as base:
                    figures += load_peer(base, forms[peer], folder, args.seconds)
            except (RuntimeError, subprocess.CalledProcessError) as error:
                # A peer that does not start here is said, and the others still run.
                print(f"{peer} did not serve: {error}", file=sys.stderr)
        bare = bare_forward(Path(target.path), target.sha256, [1, 64], fold=True, backend="auto")
    print(table(figures, bare))
    print(f"\nload average (1 min) at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
