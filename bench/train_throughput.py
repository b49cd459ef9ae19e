"""Training images/s of the engine against bare PyTorch loops, in the same run.

All train the same model at the same batch size on the same random uint8 images. The bare
loops are the minimum, once in each memory format (NCHW and channels_last): data already
normalised on the device, no augmentation, no metrics, no checkpoints. The engine runs
`training.loop.fit` as a job would (device augmentation with the CIFAR pad 4 and flip,
running metrics, diagnostics, checkpoints) in its default memory format unless told
otherwise. Its ratio is against the faster bare loop. The first window of each is a
warm-up and is not counted.

    .venv/bin/python -m bench.train_throughput --models resnet20 resnet56 --inputs 3x32x32 1x28x28
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
from training.options import RunOptions
from training.recipe import default_channels_last
from training.specs import TrainSpec

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def make_data(
    images: int, shape: tuple[int, int, int] = (3, 32, 32), seed: int = 0
) -> LoadedDataset:
    """Random uint8 images of `shape` (C, H, W) with ten classes, no test split."""
    channels, height, width = shape
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (images, *shape), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (images,), generator=generator)
    classes = tuple(map(str, range(10)))
    info = DatasetInfo(
        "random", classes, channels, (height, width), MEAN[:channels], STD[:channels]
    )
    return LoadedDataset(info, TensorSplit(pixels, labels), empty_split(info), empty_split(info))


def bare_loop(
    name: str,
    data: LoadedDataset,
    batch: int,
    steps: int,
    warmup: int,
    device: torch.device | None = None,
    channels_last: bool | None = None,
) -> float:
    """Images/s of the plainest loop: forward, loss, backward, SGD step.

    It takes the same liberties as the engine: bf16 autocast on CUDA, and the engine's
    default memory format unless `channels_last` says which.
    """
    device = device or torch.device("cpu")
    cuda = device.type == "cuda"
    if channels_last is None:
        channels_last = default_channels_last(device)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(0)
    model = models.build(
        name, num_classes=data.info.num_classes, in_channels=data.info.channels
    ).to(device)
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


def engine(
    name: str,
    data: LoadedDataset,
    batch: int,
    steps: int,
    warmup: int,
    channels_last: bool | None = None,
) -> tuple[float, bool]:
    """Images/s that the engine itself reports, leaving out its first (warm-up) window,
    and the memory format it used (True: channels_last)."""
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
                # The papers' CIFAR work per image, whatever the synthetic set's defaults.
                "augment_pad": 4,
                "augment_flip": True,
                "channels_last": channels_last,
            },
        }
    )
    sink = RecordingSink()
    with tempfile.TemporaryDirectory() as tmp:
        summary = fit(spec, data, RunOptions(out_dir=Path(tmp), device=torch.device("cpu")), sink)
    rates = [value for _, value in sink.series("images_per_s")][1:]
    # Windows of equal length: the mean rate is images over total seconds.
    return len(rates) / sum(1 / r for r in rates), summary["channels_last"]


def _shape(text: str) -> tuple[int, int, int]:
    channels, height, width = (int(part) for part in text.split("x"))
    return channels, height, width


def _format(channels_last: bool) -> str:
    return "cl" if channels_last else "nchw"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet20", "resnet56"])
    parser.add_argument(
        "--inputs", nargs="+", type=_shape, default=[(3, 32, 32)], help="CxHxW, e.g. 1x28x28."
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="Measured steps per run.")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="Alternating runs; best kept.")
    parser.add_argument(
        "--engine-channels-last",
        choices=["default", "true", "false"],
        default="default",
        help="The engine's memory format (default: its own default for the device).",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own)."
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    forced = {"default": None, "true": True, "false": False}[args.engine_channels_last]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch_size}")
    header = ("model", "input", "bare nchw", "bare cl", "engine", "format", "ratio")
    print("{:<10} {:<8} {:>10} {:>10} {:>10} {:>7} {:>6}".format(*header))
    for shape in args.inputs:
        data = make_data(args.batch_size * 40, shape)
        for name in args.models:
            rates = {False: 0.0, True: 0.0}
            engine_rate, used = 0.0, False
            for _ in range(args.repeats):
                for channels_last in (False, True):
                    rate = bare_loop(
                        name,
                        data,
                        args.batch_size,
                        args.steps,
                        args.warmup,
                        channels_last=channels_last,
                    )
                    rates[channels_last] = max(rates[channels_last], rate)
                rate, used = engine(name, data, args.batch_size, args.steps, args.warmup, forced)
                engine_rate = max(engine_rate, rate)
            ratio = engine_rate / max(rates.values())
            size = "x".join(map(str, shape))
            print(
                f"{name:<10} {size:<8} {rates[False]:>10.1f} {rates[True]:>10.1f} "
                f"{engine_rate:>10.1f} {_format(used):>7} {ratio:>6.3f}"
            )


if __name__ == "__main__":
    main()
