"""Augmented images/s of the device pipeline against a per-sample DataLoader, in one run.

(a) `training.pipeline.make_batches` on an in-memory uint8 split: the paper's augmentation
(pad 4, random 32x32 crop, random flip) and normalisation, batched, on the CPU here. It is
timed over a whole epoch, after a warm-up epoch, first batch included.
(b) The usual torchvision recipe: a DataLoader over a TensorDataset of the same uint8
images with per-sample transforms v2 (Pad, RandomCrop, RandomHorizontalFlip, ToDtype,
Normalize), with 2 workers and with none. Its first batch (worker start-up) is not timed.

    .venv/bin/python -m bench.data_pipeline
    .venv/bin/python -m bench.data_pipeline --cifar-jpeg /work/shared/data/cifar10-jpeg.tar.gz
"""

from __future__ import annotations

import argparse
import io
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchvision.transforms import v2
from torchvision.transforms.v2.functional import pil_to_tensor

from training.data import DatasetInfo, TensorSplit
from training.pipeline import make_batches

CIFAR10 = DatasetInfo(
    "cifar10",
    ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
    3,
    (32, 32),
    (0.4914, 0.4822, 0.4465),
    (0.2470, 0.2435, 0.2616),
)


def random_split(images: int, seed: int = 0) -> TensorSplit:
    """Random CIFAR-shaped uint8 images with ten classes."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (images, 3, 32, 32), dtype=torch.uint8, generator=generator)
    return TensorSplit(pixels, torch.randint(0, 10, (images,), generator=generator))


def cifar_jpeg_split(archive: Path) -> TensorSplit:
    """The training images of a `train/<class>/<n>.jpg` archive, decoded into memory."""
    images, labels = [], []
    with tarfile.open(archive) as tar:
        for member in tar:
            parts = member.name.split("/")
            if member.isfile() and parts[0] == "train" and parts[-1].endswith(".jpg"):
                data = tar.extractfile(member)
                assert data is not None  # a regular file always has contents
                with Image.open(io.BytesIO(data.read())) as image:
                    images.append(pil_to_tensor(image.convert("RGB")))
                labels.append(CIFAR10.classes.index(parts[1]))
    return TensorSplit(torch.stack(images), torch.tensor(labels))


def _rate(batches: Iterable[tuple[Tensor, Tensor]], skip: int) -> tuple[int, float]:
    """Images and images/s over `batches`, leaving the first `skip` batches untimed."""
    counted, started = 0, time.perf_counter()
    for step, (_, labels) in enumerate(batches):
        if step == skip:
            counted, started = 0, time.perf_counter()
        counted += len(labels)
    return counted, counted / (time.perf_counter() - started)


def device_pipeline(split: TensorSplit, batch_size: int) -> tuple[int, float]:
    """(a): make_batches with the paper's augmentation over one full epoch on the CPU."""
    batches = make_batches(
        split,
        CIFAR10,
        batch_size=batch_size,
        device=torch.device("cpu"),
        augment=True,
        shuffle=True,
        drop_last=False,
        seed=0,
    )
    _rate(batches.epoch(0), skip=0)  # warm-up
    return _rate(batches.epoch(1), skip=0)


class _PerSample(Dataset[tuple[Tensor, Tensor]]):
    """A TensorDataset whose images pass through a per-sample transform."""

    def __init__(self, data: TensorDataset, transform: v2.Transform) -> None:
        self._data = data
        self._transform = transform

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image, label = self._data[index]
        return self._transform(image), label


def per_sample_loader(
    split: TensorSplit, images: int, batch_size: int, workers: int
) -> tuple[int, float]:
    """(b): a DataLoader applying transforms v2 image by image to the first `images`."""
    transform = v2.Compose(
        [
            v2.Pad(4),
            v2.RandomCrop(32),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(CIFAR10.mean, CIFAR10.std),
        ]
    )
    data = TensorDataset(split.images[:images], split.labels[:images])
    loader = DataLoader(
        _PerSample(data, transform), batch_size=batch_size, shuffle=True, num_workers=workers
    )
    return _rate(loader, skip=1)


def main(argv: list[str] | None = None) -> None:
    """Measure (a) and (b) and print images/s and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=5000, help="images per DataLoader run")
    parser.add_argument("--train-size", type=int, default=50_000, help="random images in memory")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--cifar-jpeg", type=Path, help="use this CIFAR-10 JPEG archive instead")
    args = parser.parse_args(argv)

    split = cifar_jpeg_split(args.cifar_jpeg) if args.cifar_jpeg else random_split(args.train_size)
    threads = torch.get_num_threads()
    print(f"{len(split)} images of 3x32x32, batch {args.batch_size}, {threads} torch threads")
    rows = [("(a) make_batches, batched on the device", *device_pipeline(split, args.batch_size))]
    for workers in (2, 0):
        measured = per_sample_loader(split, args.images, args.batch_size, workers)
        rows.append((f"(b) DataLoader + v2 per sample, {workers} workers", *measured))
    fast = rows[0][2]
    print(f"{'pipeline':46} {'images':>7} {'images/s':>10} {'(a)/this':>9}")
    for name, images, rate in rows:
        print(f"{name:46} {images:7d} {rate:10,.0f} {fast / rate:8.1f}x")
    print(f"ratio (a)/(b, 2 workers): {fast / rows[1][2]:.1f}x (goal: 10x or more)")


if __name__ == "__main__":
    main()
