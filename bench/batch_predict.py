"""Images/s of a predict job's pass over a split (`training.batch_predict`), by batch size.

Trains the net for a few iterations on synthetic data (its weights do not change the
cost), then predicts the synthetic test split as a predict job does: the serving form in
eval mode, rows written to CSV (and JSONL with `--format both`), the confusion matrix
counted. Each rate is the best of `--rounds`, the figure least disturbed by whatever else
shares the machine; the first pass (tracing, allocator warm-up) is not counted.

    .venv/bin/python -m bench.batch_predict
    .venv/bin/python -m bench.batch_predict --model resnet56 --images 10000 --device cuda
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import cast

import torch

from training.batch_predict import Format, images_of, predict_split
from training.checkpoints import BEST, DIRECTORY, sha256_of
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
from training.predictor import Predictor
from training.specs import SyntheticSpec, TrainSpec

BATCHES = (64, 256, 512)


def _checkpoint(model: str, images: int, folder: Path) -> Path:
    """A checkpoint of `model` after 2 iterations on 32x32 synthetic data."""
    spec = TrainSpec.model_validate(
        {
            "model": {"name": model},
            "dataset": {"name": "synthetic", "train_size": 64, "test_size": images},
            "recipe": {"iterations": 2, "batch_size": 32, "checkpoint_every": 2},
        }
    )
    data = load_dataset(spec.dataset, data_root=folder)
    fit(spec, data, RunOptions(out_dir=folder), RecordingSink())
    return folder / DIRECTORY / BEST


def rate(
    predictor: Predictor, dataset: SyntheticSpec, batch: int, formats: tuple[Format, ...], out: Path
) -> float:
    """Images/s of one pass over the split at `batch`."""
    images = images_of(dataset, predictor, data_root=out)
    started = time.perf_counter()
    predict_split(
        predictor,
        images,
        out_dir=out,
        formats=formats,
        top_k=5,
        batch_size=batch,
        sink=RecordingSink(),
    )
    if predictor.device.type == "cuda":
        torch.cuda.synchronize()
    return len(images) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--format", choices=("csv", "jsonl", "both"), default="csv")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    formats = cast(
        tuple[Format, ...], ("csv", "jsonl") if args.format == "both" else (args.format,)
    )
    dataset = SyntheticSpec(name="synthetic", train_size=64, test_size=args.images)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        path = _checkpoint(args.model, args.images, out)
        device = torch.device(args.device)
        predictor = Predictor(path, sha256=sha256_of(path), device=device, fold=True)
        rate(predictor, dataset, BATCHES[0], formats, out)  # warm-up, not counted
        print(
            f"{args.model}, {args.images} images 32x32, {args.device}, {args.format}, "
            f"{torch.get_num_threads()} threads"
        )
        for batch in BATCHES:
            best = max(rate(predictor, dataset, batch, formats, out) for _ in range(args.rounds))
            print(f"batch {batch:4d}: {best:9,.0f} images/s")


if __name__ == "__main__":
    main()
