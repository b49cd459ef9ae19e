"""Training images/s of the engine against a bare PyTorch loop, in the same run.

Both train the same model at the same batch size on the same uint8 CIFAR-shaped data.
The bare loop is the minimum: data already normalised on the device, no augmentation, no
metrics, no checkpoints. The engine runs `training.loop.fit` as a job would (device
augmentation, running metrics, diagnostics, checkpoints). The first window of each is a
warm-up and is not counted.

    .venv/bin/python -m bench.train_throughput --models resnet20 resnet56
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import models
from training.data import DatasetInfo, LoadedDataset, TensorSplit, empty_split
from training.events import RecordingSink
from training.loop import fit
from training.specs import TrainSpec

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def make_data(images: int, seed: int = 0) -> LoadedDataset:
    """Random CIFAR-shaped uint8 images with ten classes, no test split."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (images, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (images,), generator=generator)
    info = DatasetInfo("random", tuple(map(str, range(10))), 3, (32, 32), MEAN, STD)
    return LoadedDataset(info, TensorSplit(pixels, labels), empty_split(info), empty_split(info))


def bare_loop(
    name: str,
    data: LoadedDataset,
    batch: int,
    steps: int,
    warmup: int,
    device: torch.device | None = None,
) -> float:
    """Images/s of the plainest loop: forward, loss, backward, SGD step.

    On CUDA it takes the same liberties as the engine (bf16 autocast, channels_last).
    """
    device = device or torch.device("cpu")
    cuda = device.type == "cuda"
    memory_format = torch.channels_last if cuda else torch.contiguous_format
    torch.manual_seed(0)
    model = models.build(name, num_classes=data.info.num_classes).to(device)
    model = model.to(memory_format=memory_format)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    assert isinstance(data.train, TensorSplit)
    mean = torch.tensor(data.info.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.info.std).view(1, -1, 1, 1)
    count = min(len(data.train), batch * 40)
    x_all = ((data.train.images[:count].float() / 255 - mean) / std).to(device)
    x_all = x_all.contiguous(memory_format=memory_format)
    y_all = data.train.labels[:count].to(device)
    started = time.perf_counter()
    for step in range(warmup + steps):
        if step == warmup:
            if cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
        i = (step * batch) % (count - batch + 1)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = F.cross_entropy(model(x_all[i : i + batch]), y_all[i : i + batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    if cuda:
        torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - started)


def engine(name: str, data: LoadedDataset, batch: int, steps: int, warmup: int) -> float:
    """Images/s that the engine itself reports, leaving out its first (warm-up) window."""
    spec = TrainSpec.model_validate(
        {
            "model": {"name": name},
            "dataset": {"name": "synthetic"},
            "recipe": {
                "batch_size": batch,
                "iterations": warmup + steps,
                "log_every": warmup,
                # A real run takes 10 diagnostics in 64k steps; one here is as sparse as it gets.
                "diagnostics_every": warmup + steps,
            },
        }
    )
    sink = RecordingSink()
    with tempfile.TemporaryDirectory() as tmp:
        fit(spec, data, out_dir=Path(tmp), sink=sink, device=torch.device("cpu"))
    rates = [value for _, value in sink.series("images_per_s")][1:]
    # Windows of equal length: the mean rate is images over total seconds.
    return len(rates) / sum(1 / r for r in rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet20", "resnet56"])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="Measured steps per run.")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="Alternating runs; best kept.")
    args = parser.parse_args()
    data = make_data(args.batch_size * 40)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch_size}")
    print(f"{'model':<10} {'bare img/s':>11} {'engine img/s':>13} {'ratio':>6}")
    for name in args.models:
        bare = engine_rate = 0.0
        for _ in range(args.repeats):
            bare = max(bare, bare_loop(name, data, args.batch_size, args.steps, args.warmup))
            engine_rate = max(
                engine_rate,
                engine(name, data, args.batch_size, args.steps, args.warmup),
            )
        print(f"{name:<10} {bare:>11.1f} {engine_rate:>13.1f} {engine_rate / bare:>6.3f}")


if __name__ == "__main__":
    main()
