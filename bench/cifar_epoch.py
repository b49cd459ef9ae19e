"""One CIFAR-10 epoch per model on the real JPEG data, on whatever device there is.

Prints, per model, the engine's training images/s, the epoch's wall time and the test
error after it, next to a bare PyTorch loop on the same data and device (the baseline),
and the device-resident pipeline's augmented images/s. Made for a lent GPU (bf16,
channels_last, optional torch.compile); `--train-limit` keeps a CPU run short.

    .venv/bin/python -m bench.cifar_epoch --archive ../shared/data/cifar10-jpeg.tar.gz \
        --models resnet20 resnet56 resnet110 --device cuda
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from bench.train_throughput import bare_loop
from training.data import LoadedDataset, TensorSplit
from training.datasets import load_dataset
from training.devices import default_device
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
from training.pipeline import Augmentation, make_batches
from training.specs import ImageFolderSpec, TrainSpec


def load(archive: Path, data_root: Path, train_limit: int | None) -> LoadedDataset:
    """The archive as an in-memory ImageFolder dataset (45k/5k/10k unless limited)."""
    target = data_root / archive.name
    if not target.exists():
        shutil.copy(archive, target)
    spec = ImageFolderSpec(name="imagefolder", path=archive.name, train_limit=train_limit)
    return load_dataset(spec, data_root=data_root)


def pipeline_rate(data: LoadedDataset, device: torch.device, batch: int) -> float:
    """Augmented images/s of the device-resident pipeline over one epoch."""
    batches = make_batches(
        data.train,
        data.info,
        batch_size=batch,
        device=device,
        augment=Augmentation(),
        shuffle=True,
        drop_last=True,
        seed=0,
        channels_last=device.type == "cuda",
    )
    for _ in batches.epoch(0):
        pass
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    count = 0
    for x, _ in batches.epoch(1):
        count += x.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return count / (time.perf_counter() - started)


def one_epoch(
    name: str, data: LoadedDataset, device: torch.device, args: argparse.Namespace
) -> dict[str, float]:
    """Train `name` for the given epochs with the engine; its summary figures."""
    spec = TrainSpec.model_validate(
        {
            "model": {"name": name},
            "dataset": {"name": "synthetic"},
            "recipe": {
                "epochs": args.epochs,
                "batch_size": args.batch_size,
                "compile": args.compile,
            },
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        summary = fit(spec, data, RunOptions(out_dir=Path(tmp), device=device), RecordingSink())
    return {
        "images_per_s": summary["images_per_s"] or 0.0,
        "wall_time_s": summary["wall_time_s"],
        "test_error": summary["final_test_error"] or float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, default=Path("../shared/data/cifar10-jpeg.tar.gz"))
    parser.add_argument("--models", nargs="+", default=["resnet20", "resnet56", "resnet110"])
    parser.add_argument("--device", default=str(default_device()))
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--train-limit", type=int, default=None)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--data-root", type=Path, default=Path("var/bench-data"))
    args = parser.parse_args()
    device = torch.device(args.device)
    args.data_root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data = load(args.archive, args.data_root, args.train_limit)
    loaded_s = time.perf_counter() - started
    print(f"loaded {len(data.train)} train / {len(data.test)} test images in {loaded_s:.1f} s")
    print(f"device {device}, torch {torch.__version__}, batch {args.batch_size}")
    print(f"torch.compile: {args.compile}")
    rate = pipeline_rate(data, device, args.batch_size)
    print(f"pipeline (pad-crop-flip on the device): {rate:,.0f} images/s")
    assert isinstance(data.train, TensorSplit)
    header = ("model", "bare img/s", "engine img/s", "ratio", "epoch s", "test err")
    print("{:<10} {:>11} {:>13} {:>6} {:>8} {:>9}".format(*header))
    for name in args.models:
        bare = bare_loop(name, data, args.batch_size, steps=50, warmup=10, device=device)
        result = one_epoch(name, data, device, args)
        ratio = result["images_per_s"] / bare
        print(
            f"{name:<10} {bare:>11,.0f} {result['images_per_s']:>13,.0f} {ratio:>6.3f} "
            f"{result['wall_time_s']:>8.1f} {100 * result['test_error']:>8.2f}%"
        )


if __name__ == "__main__":
    main()
