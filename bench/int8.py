"""ONNX Runtime's float graph against its int8 graph (`training.quantize`) on the CPU, in one
process: ResNet-20's served net (seeded weights; calibrated on seeded CIFAR-shaped images,
which sets the ranges as real images would for timing, not for accuracy), images/s at
batch 1 and 64 on one intra-op thread, the graphs alternating so a busy machine slows both
alike. Prints a table and the int8/float ratio; `--json PATH` writes it.

    .venv/bin/python -m bench.int8
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from onnxruntime.quantization import CalibrationDataReader

from models.zoo import build
from training import export, quantize

BATCHES = (1, 64)


class _Images(CalibrationDataReader):  # type: ignore[misc]  # ORT ships no types
    def __init__(self, images: torch.Tensor) -> None:
        self.batches = iter([{export.INPUT: images[i : i + 32].numpy()} for i in range(0, 128, 32)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def images_per_s(session: object, x: np.ndarray, seconds: float) -> float:
    """Images/s of `session` on `x` over about `seconds`."""
    runs, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds or not runs:
        session.run([export.OUTPUT], {export.INPUT: x})  # type: ignore[attr-defined]
        runs += 1
    return runs * len(x) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.4, help="per round and graph")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    net = export.served_net(build(args.model))
    images = torch.randn(128, 3, 32, 32)
    with tempfile.TemporaryDirectory() as folder:
        float_graph, int8_graph = Path(folder) / "float.onnx", Path(folder) / "int8.onnx"
        export.write(net, "onnx", images[:8], float_graph)
        quantize.quantize(float_graph, int8_graph, _Images(images))
        sessions = {
            "float": export.ort_session(float_graph),
            "int8": export.ort_session(int8_graph),
        }
        best: dict[str, dict[int, float]] = {name: {} for name in sessions}
        for batch in BATCHES:
            x = np.ascontiguousarray(images[:batch].numpy())
            for _ in range(args.rounds):
                for name, session in sessions.items():
                    speed = images_per_s(session, x, args.seconds)
                    best[name][batch] = max(best[name].get(batch, 0.0), speed)
    print(f"{args.model}, ONNX Runtime on one intra-op thread, images/s (best of {args.rounds})")
    print(f"{'batch':>6} {'float':>10} {'int8':>10} {'int8/float':>11}")
    rows = []
    for batch in BATCHES:
        ratio = best["int8"][batch] / best["float"][batch]
        print(
            f"{batch:>6} {best['float'][batch]:>10.0f} {best['int8'][batch]:>10.0f} {ratio:>10.2f}x"
        )
        rows.append({"batch": batch, **{n: best[n][batch] for n in sessions}, "ratio": ratio})
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
