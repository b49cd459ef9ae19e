"""The photo path on one GPU, as one prepared script (under 10 minutes on one H200-class GPU).

(1) The file pipeline's images/s against the net's training step (`bench.data_pipeline`'s
files-against-step part): photos decoded on the GPU in batches of file bytes
(`torchvision.io.decode_jpeg(device="cuda")`) and by DataLoader workers, against the bare
ResNet-50 step (bf16 autocast, channels_last) at 224 pixels.
(2) A fine-tune of an imported ResNet-18: torchvision's net (seeded weights: nothing
downloads) saved as a `.pth`, imported as the service imports weights (`training.weights`),
then trained with `init` on a five-class ImageFolder of photos for `--steps` steps with
bf16 autocast and channels_last, the backbone at a tenth of the head's lr; images/s of the
run, its test error against chance, and its wall time.

    .venv/bin/python -m bench.gpu_photos                              # on a GPU machine
    .venv/bin/python -m bench.gpu_photos --device cpu --quick         # the CPU path, small
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision
from PIL import Image

from bench import data_pipeline
from training import runs, weights
from training.devices import default_device
from training.events import RecordingSink
from training.options import RunOptions
from training.specs import TrainSpec

CLASSES = 5


def write_photo_tree(root: Path, per_class: int, size: tuple[int, int]) -> None:
    """train/ and test/ of CLASSES folders of JPEG photos whose class is their tint."""
    generator = np.random.default_rng(0)
    height, width = size
    y, x = np.mgrid[0:height, 0:width]
    for split, count in (("train", per_class), ("test", max(4, per_class // 4))):
        for label in range(CLASSES):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            tint = np.array([(label * 53) % 256, (label * 97) % 256, (label * 151) % 256])
            for index in range(count):
                base = tint + 40 * np.sin(np.stack([x, y, x + y], -1) / (7 + index % 5))
                noisy = base + generator.normal(0, 25, base.shape)
                image = Image.fromarray(noisy.clip(0, 255).astype(np.uint8))
                image.save(folder / f"{index}.jpg", quality=90)


def imported_resnet18(folder: Path) -> Path:
    """torchvision's ResNet-18 with seeded weights, saved and imported as a checkpoint."""
    torch.manual_seed(0)
    source = folder / "resnet18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), source)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    imported = weights.convert(
        weights.read(source),
        architecture="resnet18",
        options={},
        classes=None,
        preprocessing=None,
        file_name=source.name,
        source_sha256=digest,
    )
    checkpoint = folder / "imported.pt"
    torch.save(imported.checkpoint, checkpoint)
    print(f"imported {source.name}: {json.dumps(imported.facts)}")
    return checkpoint


def fine_tune(args: argparse.Namespace, device: torch.device, folder: Path) -> dict[str, Any]:
    """Fine-tune the imported ResNet-18 on the photo tree; the run's summary."""
    size = (96, 128) if args.quick else (300, 400)
    write_photo_tree(folder / "photos", args.per_class, size)
    crop = 64 if args.quick else 224
    spec = TrainSpec.model_validate(
        {
            "model": {"name": "resnet18"},
            "dataset": {
                "name": "imagefolder",
                "path": "photos",
                "image_size": crop,
                "resize": round(crop * 256 / 224),
                "validation": 0,
                "in_memory": False,
            },
            "recipe": {
                "iterations": args.steps,
                "batch_size": args.batch_size,
                "lr": 0.01,
                "schedule": "cosine",
                "mixed_precision": "bf16" if device.type == "cuda" else "off",
                "channels_last": True,
                "log_every": max(1, args.steps // 10),
                "eval_every": args.steps,
                "checkpoint_every": args.steps,
            },
            "init": {"source": str(imported_resnet18(folder)), "backbone_lr": 0.1},
        }
    )
    started = time.perf_counter()
    options = RunOptions(out_dir=folder / "run", data_root=folder, device=device)
    summary = runs.train(spec, options, RecordingSink())
    summary["wall_s"] = time.perf_counter() - started
    return summary


def main(argv: list[str] | None = None) -> None:
    """Run both parts and print their figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = str(default_device())
    parser.add_argument("--device", default=default)
    parser.add_argument("--quick", action="store_true", help="small photos and counts (CPU)")
    parser.add_argument("--photos", type=int, default=2000, help="photos of part (1)")
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers")
    parser.add_argument("--steps", type=int, default=300, help="fine-tuning steps of (2)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--per-class", type=int, default=400, help="training photos a class")
    args = parser.parse_args(argv)
    if args.quick:
        args.photos, args.steps, args.batch_size, args.per_class = 16, 4, 8, 8
        args.workers = min(args.workers, 2)
    device = torch.device(args.device)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    print("(1) the file pipeline against the training step")
    pipeline = ["--only-files", "--device", args.device, "--photos", str(args.photos)]
    # The paper's ResNet-50 eats the photos on a GPU; the CPU path checks with ResNet-18.
    pipeline += ["--workers", str(args.workers)]
    pipeline += ["--photo-model", "resnet18" if args.quick else "resnet50"]
    if args.quick:
        pipeline += ["--cifar-files", "64", "--steps", "1", "--photo-batch", "8"]
    data_pipeline.main(pipeline)
    print("(2) fine-tuning an imported ResNet-18 (bf16 on CUDA, channels_last)")
    with tempfile.TemporaryDirectory(prefix="gpu-photos-") as folder:
        summary = fine_tune(args, device, Path(folder))
    final = summary.get("final_test_error")
    chance = 1 - 1 / CLASSES
    print(
        f"  {summary['steps']} steps of batch {args.batch_size}: "
        f"{summary['images_per_s'] or 0:,.0f} images/s, test error {final} (chance {chance:.2f}), "
        f"wall {summary['wall_s']:.1f} s, augmentation {summary['augmentation']['recipe']}"
    )


if __name__ == "__main__":
    main()
