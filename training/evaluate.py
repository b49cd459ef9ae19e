"""Evaluation: loss, top-1/top-5 error, per-class accuracy, confusion, calibration.

Everything accumulates on the device and is read once at the end.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.data import Batches

ECE_BINS = 15


@dataclass(frozen=True)
class Evaluation:
    """The results of evaluating a model on one split."""

    count: int
    loss: float
    error: float
    top5_error: float
    per_class_accuracy: list[float]
    confusion: list[list[int]]  # rows: true class, columns: predicted class
    ece: float  # expected calibration error, 15 equal-width confidence bins
    images_per_s: float
    classes: list[str] = field(default_factory=list)  # names, when the caller knows them
    view: str = "center"  # how each image was seen (training.views)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def predict_logits(model: nn.Module, x: Tensor, *, tta_flip: bool = False) -> Tensor:
    """Logits for a batch; with `tta_flip`, averaged with the horizontally flipped view."""
    logits: Tensor = model(x)
    if tta_flip:
        logits = (logits + model(x.flip(3))) / 2
    return logits.float()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Batches,
    num_classes: int,
    *,
    tta_flip: bool = False,
    autocast_dtype: torch.dtype | None = None,
) -> Evaluation:
    """Evaluate `model` on every batch, in eval mode (restoring its mode afterwards)."""
    was_training = model.training
    model.eval()
    sums: dict[str, Tensor] = {}
    started = time.perf_counter()
    for x, y in batches.epoch(0):
        with torch.autocast(
            x.device.type,
            dtype=autocast_dtype or torch.bfloat16,
            enabled=autocast_dtype is not None,
        ):
            logits = predict_logits(model, x, tta_flip=tta_flip)
        accumulate(sums, logits, y, num_classes)
    model.train(was_training)
    if not sums:
        raise ValueError("cannot evaluate on an empty split")
    elapsed = time.perf_counter() - started
    return summarise({k: v.cpu() for k, v in sums.items()}, num_classes, elapsed)


def accumulate(sums: dict[str, Tensor], logits: Tensor, y: Tensor, num_classes: int) -> None:
    """Add one batch's counts (loss, errors, confusion, calibration bins) to `sums`."""
    probs = logits.softmax(1)
    confidence, predicted = probs.max(1)
    correct = predicted == y
    top5 = logits.topk(min(5, num_classes), dim=1).indices.eq(y[:, None]).any(1)
    # A diverged net's NaN confidences land in the first bin (its ECE is NaN), not outside.
    bins = (confidence * ECE_BINS).long().clamp(0, ECE_BINS - 1)
    batch = {
        "loss": F.cross_entropy(logits, y, reduction="sum"),
        "correct": correct.sum(),
        "top5": top5.sum(),
        "confusion": torch.bincount(y * num_classes + predicted, minlength=num_classes**2),
        "bin_count": torch.bincount(bins, minlength=ECE_BINS),
        "bin_confidence": torch.bincount(bins, weights=confidence, minlength=ECE_BINS),
        "bin_correct": torch.bincount(bins, weights=correct.float(), minlength=ECE_BINS),
    }
    for key, value in batch.items():
        sums[key] = sums[key] + value if key in sums else value


def summarise(sums: dict[str, Tensor], num_classes: int, elapsed: float) -> Evaluation:
    """The `Evaluation` of accumulated counts."""
    confusion = sums["confusion"].view(num_classes, num_classes)
    count = int(confusion.sum())
    per_class = confusion.diag().double() / confusion.sum(1).clamp(min=1).double()
    gaps = (sums["bin_confidence"] - sums["bin_correct"]).abs()
    return Evaluation(
        count=count,
        loss=float(sums["loss"]) / count,
        error=1 - float(sums["correct"]) / count,
        top5_error=1 - float(sums["top5"]) / count,
        per_class_accuracy=per_class.tolist(),
        confusion=confusion.tolist(),
        ece=float(gaps.sum()) / count,
        images_per_s=count / max(elapsed, 1e-9),
    )
