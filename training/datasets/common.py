"""What every reader shares: the not-found error, seeded splits and training statistics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import numpy as np
import torch
from torch import Tensor

from training.data import (
    DatasetInfo,
    FileSplit,
    LoadedDataset,
    Provenance,
    Split,
    TensorSplit,
    empty_split,
)
from training.datasets.images import open_image
from training.specs import DatasetSpec

# Normalisation of a file-backed split is estimated from this many training images.
STATS_SAMPLE = 2_000
# Chunk of images summed at a time: statistics never hold the split in float.
STATS_CHUNK = 1_024


class DatasetNotFound(ValueError):  # noqa: N818 (the name the service's API uses)
    """A dataset's files are in none of the places looked in."""


@dataclass(frozen=True)
class Parts:
    """What a reader found: class names, image shape, the splits and where they came from.

    `val` is a validation split the data brings (an ImageFolder's val/ beside its test/);
    without one, validation is held out of `train`.
    """

    name: str
    classes: tuple[str, ...]
    channels: int
    image_size: tuple[int, int]  # (height, width)
    train: Split
    test: Split
    digest: str  # training.datasets.digest
    source: str
    val: Split | None = None
    skipped: tuple[tuple[str, str], ...] = ()  # (file, error) of unreadable files left out


def source_name(path: Path, data_root: Path) -> str:
    """`path` relative to the data root where it lies inside it, else as it is."""
    resolved, root = path.resolve(), data_root.resolve()
    return resolved.relative_to(root).as_posix() if resolved.is_relative_to(root) else str(path)


def not_found(name: str, places: Sequence[Path], hint: str) -> DatasetNotFound:
    """The error for a dataset found in none of `places`, saying how to provide it."""
    looked = ", ".join(str(place) for place in places)
    return DatasetNotFound(f"dataset {name!r} not found; looked in: {looked}; {hint}")


def download_with_torchvision(class_name: str, data_root: Path) -> None:
    """Download a dataset into `data_root` with torchvision's class `class_name`."""
    from torchvision import datasets  # imported here: only downloads need it

    data_root.mkdir(parents=True, exist_ok=True)
    try:
        getattr(datasets, class_name)(root=str(data_root), download=True)
    except (OSError, RuntimeError) as error:
        raise DatasetNotFound(
            f"downloading {class_name} into {data_root} failed: {error}"
        ) from error


@overload
def take(split: TensorSplit, indices: Tensor) -> TensorSplit: ...
@overload
def take(split: FileSplit, indices: Tensor) -> FileSplit: ...
def take(split: Split, indices: Tensor) -> Split:
    """The images of `split` at `indices`, in that order."""
    if isinstance(split, TensorSplit):
        return TensorSplit(split.images[indices], split.labels[indices])
    return FileSplit(tuple(split.paths[i] for i in indices.tolist()), split.labels[indices])


def stratified_split(labels: Tensor, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Seeded (kept, held-out) indices, holding out `fraction` of every class."""
    generator = torch.Generator().manual_seed(seed)
    kept, held = [], []
    for label in torch.unique(labels):
        members = (labels == label).nonzero().flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        count = round(len(members) * fraction)
        held.append(members[:count])
        kept.append(members[count:])
    return torch.cat(kept).sort().values, torch.cat(held).sort().values


def hold_out(split: Split, fraction: float, seed: int) -> tuple[Split, Split]:
    """Seeded (train, validation) parts of a training split; train stays in shuffled order."""
    order = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))
    count = round(len(split) * fraction)
    return take(split, order[count:]), take(split, order[:count])


def channel_stats(images: Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images (N, C, H, W) on the [0, 1] scale."""
    total = torch.zeros(images.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    # Sums of uint8 values and their squares are exact in float64 for any realistic N.
    for chunk in torch.split(images, STATS_CHUNK):
        values = chunk.to(torch.float64)
        total += values.sum((0, 2, 3))
        squares += values.square().sum((0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3] * 255.0
    mean = total / count
    std = (squares / (count * 255.0) - mean.square()).clamp(min=0).sqrt()
    return tuple(mean.tolist()), tuple(std.tolist())


def split_stats(
    split: Split, channels: int, size: tuple[int, int], seed: int
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of a split; a file split's from a seeded sample."""
    if isinstance(split, TensorSplit):
        return channel_stats(split.images)
    order = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))
    # Imported here: training.preprocess imports this package (its images module) first.
    from training.preprocess import Preprocessing

    geometry = Preprocessing.for_decoding(size, None, channels)
    sample = []
    for index in order[:STATS_SAMPLE].tolist():
        with open_image(split.paths[index]) as image:
            sample.append(geometry.image(image))
    return channel_stats(torch.from_numpy(np.stack(sample)))


def class_counts(labels: Tensor, classes: int) -> tuple[int, ...]:
    """Images of each of `classes` classes among `labels`."""
    return tuple(torch.bincount(labels, minlength=classes).tolist())


def _check_labels(parts: Parts) -> None:
    """Refuse labels that name no class (they would crash the loss much later)."""
    val = parts.val.labels if parts.val is not None else torch.empty(0, dtype=torch.int64)
    labels = torch.cat([parts.train.labels, val, parts.test.labels])
    if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < len(parts.classes):
        raise ValueError(f"dataset {parts.name!r} has labels outside 0..{len(parts.classes) - 1}")


def assemble(parts: Parts, spec: DatasetSpec) -> LoadedDataset:
    """Hold out validation (unless the data brings its own), apply the train limit and
    measure the final training split (its channels' mean and std, its class counts)."""
    _check_labels(parts)
    fraction = spec.validation if parts.val is None else 0.0
    train, val = hold_out(parts.train, fraction, spec.split_seed)
    val = val if parts.val is None else parts.val
    if spec.train_limit is not None:
        train = take(train, torch.arange(min(spec.train_limit, len(train))))
    if len(train) == 0:
        raise ValueError(f"dataset {parts.name!r} has no training images left after the splits")
    mean, std = split_stats(train, parts.channels, parts.image_size, spec.split_seed)
    counts = class_counts(train.labels, len(parts.classes))
    info = DatasetInfo(
        parts.name, parts.classes, parts.channels, parts.image_size, mean, std, counts
    )
    val = val if len(val) else empty_split(info)
    sizes = {"train": len(train), "val": len(val), "test": len(parts.test)}
    provenance = Provenance(parts.digest, parts.source, parts.classes, sizes, parts.skipped)
    return LoadedDataset(info, train, val, parts.test, provenance)
