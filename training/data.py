"""The shapes data takes between the readers, the input pipeline and the loop.

Readers (`training.datasets`) return a `LoadedDataset`; the input pipeline
(`training.pipeline`) turns a split into `Batches` for the loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor


@dataclass(frozen=True)
class DatasetInfo:
    """What a model and a checkpoint need to know about the data it was trained on."""

    name: str
    classes: tuple[str, ...]
    channels: int
    image_size: tuple[int, int]  # (height, width)
    mean: tuple[float, ...]  # per channel, of the training split, on the [0, 1] scale
    std: tuple[float, ...]
    # Images of each class in the training split; None in checkpoints written before they
    # were recorded, and for weights imported from elsewhere.
    class_counts: tuple[int, ...] | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def to_record(self) -> dict[str, Any]:
        """A plain dict for checkpoints (loadable with `weights_only=True`) and JSON."""
        return {
            "name": self.name,
            "classes": list(self.classes),
            "channels": self.channels,
            "image_size": list(self.image_size),
            "mean": list(self.mean),
            "std": list(self.std),
            "class_counts": list(self.class_counts) if self.class_counts is not None else None,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> DatasetInfo:
        """The `DatasetInfo` that `to_record` wrote (a record with no class counts has none)."""
        height, width = record["image_size"]
        counts = record.get("class_counts")
        return cls(
            name=record["name"],
            classes=tuple(record["classes"]),
            channels=record["channels"],
            image_size=(height, width),
            mean=tuple(record["mean"]),
            std=tuple(record["std"]),
            class_counts=tuple(counts) if counts is not None else None,
        )


@dataclass(frozen=True)
class TensorSplit:
    """A split held in memory: uint8 images (N, C, H, W) and int64 labels (N,)."""

    images: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class FileSplit:
    """A split too large for memory: image files decoded per sample by DataLoader workers."""

    paths: tuple[Path, ...]
    labels: Tensor

    def __len__(self) -> int:
        return len(self.paths)


Split = TensorSplit | FileSplit
# Bad files a provenance names; all of them are counted.
SKIPPED_NAMED = 20


@dataclass(frozen=True)
class Provenance:
    """Which data a run read: its digest, where from, its classes, split sizes and the
    unreadable files left out (`bad_files: skip`)."""

    digest: str  # "sha256:<64 hex>" (training.datasets.digest says over what)
    source: str  # the folder or file read, relative to the data root where it is inside it
    classes: tuple[str, ...]
    splits: Mapping[str, int]  # images in "train", "val" and "test", after every split
    skipped: tuple[tuple[str, str], ...] = ()  # (file, error) of every file left out

    def to_record(self) -> dict[str, Any]:
        """A plain dict for summaries and checkpoints: the first bad files named, all counted."""
        return {
            "digest": self.digest,
            "source": self.source,
            "classes": list(self.classes),
            "splits": dict(self.splits),
            "skipped": [
                {"file": file, "error": error} for file, error in self.skipped[:SKIPPED_NAMED]
            ],
            "skipped_count": len(self.skipped),
        }


@dataclass(frozen=True)
class LoadedDataset:
    """A dataset's info and its train / validation / test splits (validation may be empty).

    `provenance` is set by every reader (`training.datasets.load_dataset`); a dataset made
    by hand (benchmarks, tests) has none.
    """

    info: DatasetInfo
    train: Split
    val: Split
    test: Split
    provenance: Provenance | None = None

    def split(self, name: str) -> Split:
        """The split called `name` ("train", "val" or "test")."""
        splits: dict[str, Split] = {"train": self.train, "val": self.val, "test": self.test}
        return splits[name]


def empty_split(info: DatasetInfo) -> TensorSplit:
    """A split with no images, shaped like the dataset's."""
    height, width = info.image_size
    images = torch.empty(0, info.channels, height, width, dtype=torch.uint8)
    return TensorSplit(images, torch.empty(0, dtype=torch.int64))


class Batches(Protocol):
    """Batches of normalised float images and int64 labels, already on the device.

    `epoch(e, start)` yields the batches of epoch `e` from batch index `start` on; the same
    (seed, e) gives the same order and augmentation, so a resumed run continues exactly.
    """

    def __len__(self) -> int: ...

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]: ...
