"""Augmented images/s of the device pipeline against a per-sample DataLoader, in one run.

(a) `training.pipeline.make_batches` on an in-memory uint8 split: the paper's augmentation
(pad 4, random 32x32 crop, random flip) and normalisation, batched, on the CPU here. It is
timed over a whole epoch, after a warm-up epoch, first batch included.
(b) The usual torchvision recipe: a DataLoader over a TensorDataset of the same uint8
images with per-sample transforms v2 (Pad, RandomCrop, RandomHorizontalFlip, ToDtype,
Normalize), with 2 workers and with none. Its first batch (worker start-up) is not timed.
(c) The file pipeline alone (`make_batches` on a file-backed ImageFolder: DataLoader
workers decoding and augmenting) against the bare training step of the net that would
eat it, on the same machine: 32x32 PNGs with the CIFAR recipe for ResNet-20, and ~300x400
JPEG photos with RandomResizedCrop to 224 for ResNet-18, written to a temporary folder.
A ratio above 1 means the files keep the net fed. With `--device cuda` the step runs on
the GPU and the photos are also decoded there, in batches of file bytes
(`torchvision.io.decode_jpeg(device="cuda")`).

    .venv/bin/python -m bench.data_pipeline
    .venv/bin/python -m bench.data_pipeline --cifar-jpeg /work/shared/data/cifar10-jpeg.tar.gz
    .venv/bin/python -m bench.data_pipeline --device cuda --photos 2000 --workers 8
"""

from __future__ import annotations

import argparse
import io
import tarfile
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchvision.transforms import v2
from torchvision.transforms.v2.functional import pil_to_tensor

from bench.train_throughput import bare_loop, make_data
from training.data import DatasetInfo, FileSplit, LoadedDataset, TensorSplit
from training.datasets import load_dataset
from training.pipeline import Augmentation, make_batches
from training.specs import ImageFolderSpec

PHOTO_SIZE = (300, 400)  # (height, width) of the generated photos
PHOTO_INPUT = 224

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


def write_cifar_files(folder: Path, count: int) -> None:
    """`count` random 32x32 PNGs in ten class folders."""
    generator = np.random.default_rng(0)
    for index in range(count):
        (folder / str(index % 10)).mkdir(parents=True, exist_ok=True)
        pixels = generator.integers(0, 256, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / str(index % 10) / f"{index}.png")


def write_photos(folder: Path, count: int) -> None:
    """`count` photo-like JPEGs of 300x400 (smooth gradients and noise, ~60 kB) in two
    class folders."""
    generator = np.random.default_rng(0)
    y, x = np.mgrid[0 : PHOTO_SIZE[0], 0 : PHOTO_SIZE[1]]
    for index in range(count):
        (folder / str(index % 2)).mkdir(parents=True, exist_ok=True)
        base = np.stack([(x + index) % 256, (2 * y) % 256, (x + y) % 256], -1)
        pixels = (base + generator.normal(0, 20, base.shape)).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / str(index % 2) / f"{index}.jpg", quality=90)


def file_data(root: Path, path: str, image_size: int | None) -> LoadedDataset:
    """The file-backed ImageFolder at `root/path`, every image its training split."""
    spec = ImageFolderSpec(
        name="imagefolder", path=path, image_size=image_size, in_memory=False, validation=0
    )
    return load_dataset(spec, data_root=root)


def file_pipeline(
    data: LoadedDataset, augmentation: Augmentation, batch: int, workers: int, device: torch.device
) -> tuple[int, float]:
    """Images/s of make_batches streaming a file split (decode, augment, normalise) to
    `device` over one epoch, its first batch (worker start-up) untimed."""
    assert isinstance(data.train, FileSplit)
    batches = make_batches(
        data.train,
        data.info,
        batch_size=batch,
        device=device,
        augment=augmentation,
        shuffle=True,
        drop_last=False,
        seed=0,
        num_workers=workers,
    )
    counted, rate = _rate(_synchronised(batches.epoch(0), device), skip=1)
    return counted, rate


def _synchronised(
    batches: Iterable[tuple[Tensor, Tensor]], device: torch.device
) -> Iterator[tuple[Tensor, Tensor]]:
    """The batches, each waited for on a GPU so the timing counts its copy and work."""
    for batch in batches:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        yield batch


def training_step(
    name: str, shape: tuple[int, int, int], batch: int, steps: int, device: torch.device
) -> float:
    """Images/s of the bare training step (forward, loss, backward, SGD) at `shape`."""
    data = make_data(batch * 2, shape)
    return bare_loop(name, data, batch, steps, warmup=1, device=device)


def gpu_decoded(paths: tuple[Path, ...], batch: int, device: torch.device) -> tuple[int, float]:
    """Images/s of JPEG files decoded on the GPU a batch of file bytes at a time, resized
    to 224x224 and flipped there (the decoder of the photos' GPU path)."""
    from torchvision.io import decode_jpeg  # the GPU path only
    from torchvision.transforms.v2 import functional as TF

    counted, started = 0, time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchvision 0.29 marks its decoders deprecated
        for step, first in enumerate(range(0, len(paths), batch)):
            if step == 1:
                torch.cuda.synchronize(device)
                counted, started = 0, time.perf_counter()
            chunk = paths[first : first + batch]
            data = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in chunk]
            decoded = decode_jpeg(data, device=device)
            images = torch.stack(
                [TF.resize(image, [PHOTO_INPUT, PHOTO_INPUT], antialias=True) for image in decoded]
            )
            images = torch.where(torch.rand(len(images), 1, 1, 1, device=device) < 0.5,
                                 images.flip(3), images)  # fmt: skip
            counted += len(images)
    torch.cuda.synchronize(device)
    return counted, counted / (time.perf_counter() - started)


def files_against_step(args: argparse.Namespace, device: torch.device) -> None:
    """(c): the file pipeline's images/s against the training step's, CIFAR-sized and photos."""
    with tempfile.TemporaryDirectory(prefix="data-pipeline-") as scratch:
        root = Path(scratch)
        write_cifar_files(root / "cifar", args.cifar_files)
        write_photos(root / "photos", args.photos)
        cifar, photos = file_data(root, "cifar", None), file_data(root, "photos", PHOTO_INPUT)
        cases = [
            ("32x32 PNG, cifar crop", cifar, Augmentation(pad=4), "resnet20", (3, 32, 32)),
            (
                "300x400 JPEG, RRC 224",
                photos,
                Augmentation(recipe="random_resized_crop"),
                args.photo_model,
                (3, PHOTO_INPUT, PHOTO_INPUT),
            ),
        ]
        print(f"\n(c) file pipeline ({args.workers} workers) against the training step, {device}")
        print(f"{'images':24} {'net':9} {'files/s':>9} {'step/s':>9} {'files/step':>10}")
        for label, data, augmentation, net, shape in cases:
            batch = args.batch_size if net == "resnet20" else args.photo_batch
            _, files = file_pipeline(data, augmentation, batch, args.workers, device)
            step = training_step(net, shape, batch, args.steps, device)
            print(f"{label:24} {net:9} {files:9,.1f} {step:9,.1f} {files / step:9.2f}x")
        if device.type == "cuda":
            assert isinstance(photos.train, FileSplit)
            _, decoded = gpu_decoded(photos.train.paths, args.photo_batch, device)
            step = training_step(args.photo_model, (3, PHOTO_INPUT, PHOTO_INPUT), args.photo_batch,
                                 args.steps, device)  # fmt: skip
            print(f"{'JPEG decoded on the GPU':24} {args.photo_model:9} {decoded:9,.1f} "
                  f"{step:9,.1f} {decoded / step:9.2f}x")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Measure (a) and (b) and print images/s and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=5000, help="images per DataLoader run")
    parser.add_argument("--train-size", type=int, default=50_000, help="random images in memory")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--cifar-jpeg", type=Path, help="use this CIFAR-10 JPEG archive instead")
    parser.add_argument("--cifar-files", type=int, default=2048, help="32x32 PNGs for (c)")
    parser.add_argument("--photos", type=int, default=384, help="300x400 JPEGs for (c)")
    parser.add_argument("--photo-batch", type=int, default=32, help="batch of the photos' net")
    parser.add_argument("--photo-model", default="resnet18", help="the photos' net, e.g. resnet50")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers in (c)")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps in (c)")
    parser.add_argument("--device", default="cpu", help="where (c) trains: cpu or cuda")
    parser.add_argument("--only-files", action="store_true", help="run (c) alone")
    args = parser.parse_args(argv)
    if not args.only_files:
        in_memory_against_loader(args)
    files_against_step(args, torch.device(args.device))


def in_memory_against_loader(args: argparse.Namespace) -> None:
    """(a) against (b): the device pipeline against a per-sample DataLoader."""
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
