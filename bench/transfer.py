"""Transfer: a ResNet fine-tuned from CIFAR-10's classes 0-4 against one trained from scratch.

Pre-trains once on the 25,000 training images of classes 0-4 (airplane .. deer) of the JPEG
copy of CIFAR-10, then trains on 100 images per class of classes 5-9 (dog .. truck), over
several seeds: fine-tuned from the pre-trained best checkpoint (`init`, a new 5-class head),
and from scratch with the same recipe and steps. Prints the test errors on the test images
of classes 5-9 (all 1,000 a class, or `--test-per-class`; median, min, max per arm) and
writes a figure of test error against steps for both arms. The defaults fit about 20
minutes of a busy 2-core CPU.

    nice -n 5 .venv/bin/python -u -m bench.transfer \
        --archive /work/shared/data/cifar10-jpeg.tar.gz --test-per-class 400 \
        --figure docs/transfer.png
"""

from __future__ import annotations

import argparse
import statistics
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from training import runs
from training.events import RecordingSink
from training.options import RunOptions
from training.specs import TrainSpec

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SOURCE, TARGET = CLASSES[:5], CLASSES[5:]


def extract(archive: Path, root: Path, per_class: int, test_per_class: int) -> None:
    """`root/source` (classes 0-4, every image) and `root/target` (classes 5-9, `per_class`
    training images each, `test_per_class` test images each) as ImageFolder trees."""
    taken: defaultdict[tuple[str, str], int] = defaultdict(int)
    # In the archive's order: a gzip stream read backwards is decompressed again each time.
    with tarfile.open(archive, "r|gz") as tar:
        for member in tar:
            if not member.isfile():
                continue
            split, label, name = member.name.split("/")[-3:]
            tree = "source" if label in SOURCE else "target"
            if tree == "target":
                # Every test image of classes 5-9 unless limited; `per_class` to train on.
                limit = per_class if split == "train" else test_per_class
                if taken[split, label] >= limit:
                    continue
                taken[split, label] += 1
            out = root / tree / split / label / name
            out.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            out.write_bytes(source.read())


def spec(path: str, recipe: dict[str, Any], init: dict[str, Any] | None = None) -> TrainSpec:
    """ResNet-20 on an ImageFolder tree of 32x32 images, no validation split."""
    return TrainSpec.model_validate(
        {
            "model": {"name": "resnet20"},
            "dataset": {"name": "imagefolder", "path": path, "validation": 0},
            "recipe": recipe,
            "init": init,
        }
    )


def train(train_spec: TrainSpec, root: Path, out: Path) -> RecordingSink:
    """One run; its sink holds the metrics."""
    sink = RecordingSink()
    runs.train(train_spec, RunOptions(out_dir=out, data_root=root, resume=False), sink)
    return sink


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archive", type=Path, required=True)
    parser.add_argument("--figure", type=Path, default=Path("docs/transfer.png"))
    parser.add_argument("--pretrain-steps", type=int, default=1200)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--test-per-class", type=int, default=1000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--backbone-lr", type=float, default=0.1, help="init.backbone_lr")
    parser.add_argument(
        "--pretrained", type=Path, help="A checkpoint of classes 0-4 to start from: no pre-training"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        extract(args.archive, root, args.per_class, args.test_per_class)
        best = args.pretrained or pretrain(root, args.pretrain_steps, started)
        init = {"source": str(best), "backbone_lr": args.backbone_lr}
        curves: dict[str, list[list[tuple[int, float]]]] = {"fine-tuned": [], "from scratch": []}
        for seed in args.seeds:
            recipe = {
                "iterations": args.steps,
                "batch_size": 64,
                "lr": args.lr,
                "schedule": "cosine",
                "seed": seed,
                "eval_every": args.eval_every,
                "log_every": 50,
            }
            for arm, arm_init in (("fine-tuned", init), ("from scratch", None)):
                sink = train(spec("target", recipe, arm_init), root, root / f"{arm}-{seed}")
                curves[arm].append(sink.series("test/error"))
                print(
                    f"{arm} seed {seed}: final test error {curves[arm][-1][-1][1]:.4f}", flush=True
                )
        report(curves, args, time.perf_counter() - started)
        figure(curves, args)


def pretrain(root: Path, steps: int, started: float) -> Path:
    """Pre-train on classes 0-4; the best checkpoint."""
    pre = {"iterations": steps, "schedule": "cosine", "log_every": 100}
    pre_error = train(spec("source", pre), root, root / "pre").series("test/error")[-1][1]
    pre_s = time.perf_counter() - started
    print(
        f"pre-trained {steps} steps on classes 0-4: test error "
        f"{pre_error:.4f} ({pre_s:.0f} s with extraction)"
    )
    return root / "pre" / "checkpoints" / "best.pt"


def report(curves: dict[str, list[list[tuple[int, float]]]], args: Any, seconds: float) -> None:
    """The table of final test errors per arm, and whether fine-tuning wins beyond the spread."""
    finals = {arm: [curve[-1][1] for curve in runs_] for arm, runs_ in curves.items()}
    print(
        f"\nResNet-20, classes 5-9 of CIFAR-10: {5 * args.per_class} training images, "
        f"{args.steps} steps of batch 64, seeds {args.seeds}"
    )
    print(f"{'arm':<14} {'median':>8} {'min':>8} {'max':>8}", flush=True)
    for arm, errors in finals.items():
        print(
            f"{arm:<14} {statistics.median(errors):8.4f} {min(errors):8.4f} {max(errors):8.4f}",
            flush=True,
        )
    tuned, scratch = finals["fine-tuned"], finals["from scratch"]
    gap = statistics.median(scratch) - statistics.median(tuned)
    spread = max(max(tuned) - min(tuned), max(scratch) - min(scratch))
    wins = max(tuned) < min(scratch) and gap > spread
    print(
        f"median gain {gap:.4f}, largest spread {spread:.4f}: "
        f"{'fine-tuning wins beyond the spread' if wins else 'NOT beyond the spread'}"
    )
    print(f"whole benchmark: {seconds / 60:.1f} min", flush=True)


def figure(curves: dict[str, list[list[tuple[int, float]]]], args: Any) -> None:
    """Test error against steps: the median over seeds, and the min-max band."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, runs_ in curves.items():
        steps = [step for step, _ in runs_[0]]
        by_step = list(zip(*[[error for _, error in curve] for curve in runs_], strict=True))
        ax.plot(steps, [statistics.median(v) for v in by_step], marker="o", label=arm)
        ax.fill_between(steps, [min(v) for v in by_step], [max(v) for v in by_step], alpha=0.2)
    ax.set_xlabel("step (batch 64)")
    ax.set_ylabel("test error, classes 5-9")
    ax.set_title(f"ResNet-20, {5 * args.per_class} images: fine-tuned from classes 0-4 vs scratch")
    ax.grid(alpha=0.3)
    ax.legend()
    args.figure.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.figure, dpi=120)
    print(f"figure: {args.figure}", flush=True)


if __name__ == "__main__":
    main()
