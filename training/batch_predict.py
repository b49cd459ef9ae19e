"""Batch prediction: a checkpoint's top-k classes for every image of a dataset split.

Rows come in file order, one per image: `file` (the image's path below the dataset's
folder, or `<split>/<index>` for a dataset held as arrays, such as CIFAR), `label` (the
dataset's class name), then the top-k classes. `predictions.csv` has `pred_1, prob_1 ...
pred_k, prob_k` (class names and probabilities); each line of `predictions.jsonl` has the
top-k's names, indices and probabilities and the whole probability vector. When the
dataset's classes are the model's, `confusion.json` holds the confusion matrix (rows: true
class, columns: predicted) and the result the top-1 and top-k errors.

A CSV text cell that a spreadsheet would run as a formula (a class folder `@SUM(1)`) is
quoted (`training.spreadsheets`). Every file is written under a temporary name and renamed
once complete: a reader sees the whole file or none.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np
import torch
from torch import Tensor

from training import gradcam
from training.data import DatasetInfo, FileSplit, LoadedDataset, TensorSplit
from training.datasets.archives import MAX_BYTES, MAX_ENTRIES
from training.datasets.imagefolder import find_tree
from training.datasets.images import open_image
from training.evaluation_data import load_for_reading, nonempty_split
from training.events import EventSink
from training.pipeline import Normalise
from training.predictor import Predictor
from training.preprocess import Preprocessing
from training.specs import DatasetSpec, ImageFolderSpec
from training.spreadsheets import text_cell

Format = Literal["csv", "jsonl"]
FILES: dict[Format, str] = {"csv": "predictions.csv", "jsonl": "predictions.jsonl"}
CONFUSION = "confusion.json"
TEMP_SUFFIX = ".partial"


@dataclass(frozen=True)
class Images:
    """A split's images in file order: names, labels (the dataset's class indices), the
    dataset's classes, and a reader of the uint8 images in [start, stop)."""

    names: list[str]
    labels: Tensor
    classes: tuple[str, ...]
    read: Callable[[int, int], Tensor]

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class Prediction:
    """What a batch prediction wrote and measured; errors only when labels are the model's."""

    images: int
    top_k: int  # the classes a row names: at most all
    labelled: bool
    error: float | None
    top_k_error: float | None
    files: list[Path]
    images_per_s: float
    stopped: bool


def images_of(
    dataset: DatasetSpec,
    predictor: Predictor,
    *,
    data_root: Path,
    download: bool = False,
    prepare: Callable[[LoadedDataset], None] | None = None,
) -> Images:
    """The images of `dataset.split`, as the predictor's checkpoint takes them: files through
    its declared preprocessing, arrays as they are (of its input size)."""
    info, preprocessing = predictor.info, predictor.preprocessing
    # An ImageFolder is read from its files: their names are the rows' keys.
    data = load_for_reading(dataset, data_root=data_root, download=download, prepare=prepare)
    split = nonempty_split(data, dataset.split)
    if isinstance(split, FileSplit):
        assert isinstance(dataset, ImageFolderSpec), "only an ImageFolder is read from files"
        tree = find_tree(dataset, data_root, max_entries=MAX_ENTRIES, max_bytes=MAX_BYTES)
        return _files(split, tree, preprocessing, data.info.classes)
    return _arrays(split, dataset.split, info, data.info)


def _files(
    split: FileSplit, tree: Path, preprocessing: Preprocessing, classes: tuple[str, ...]
) -> Images:
    """A file split sorted by path; each image made input by the checkpoint's preprocessing."""
    order = sorted(range(len(split)), key=lambda index: split.paths[index])
    paths = [split.paths[index] for index in order]

    def read(start: int, stop: int) -> Tensor:
        chunk = []
        for path in paths[start:stop]:
            with open_image(path) as image:
                chunk.append(preprocessing.image(image))
        return torch.from_numpy(np.stack(chunk))

    names = [path.relative_to(tree).as_posix() for path in paths]
    return Images(names, split.labels[order], classes, read)


def _arrays(split: TensorSplit, name: str, info: DatasetInfo, data: DatasetInfo) -> Images:
    """An in-memory split in its stored order, named `<split>/<index>`."""
    if (data.channels, data.image_size) != (info.channels, info.image_size):
        height, width = data.image_size
        raise ValueError(
            f"{data.name} holds {height}x{width} images with {data.channels} channel(s); the "
            f"model takes {info.image_size[0]}x{info.image_size[1]} with {info.channels}"
        )
    names = [f"{name}/{index}" for index in range(len(split))]
    return Images(names, split.labels, data.classes, lambda start, stop: split.images[start:stop])


class Rows:
    """The prediction files being written, under temporary names until `commit`."""

    def __init__(
        self, folder: Path, formats: tuple[Format, ...], classes: tuple[str, ...], top_k: int
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.classes, self.top_k = classes, top_k
        self.targets = [folder / FILES[form] for form in formats]
        self.temps = [_temp_of(target) for target in self.targets]
        self.handles: dict[Format, TextIO] = {
            form: temp.open("w", newline="") for form, temp in zip(formats, self.temps, strict=True)
        }
        if "csv" in self.handles:
            self.csv = csv.writer(self.handles["csv"])
            ranks = range(1, top_k + 1)
            self.csv.writerow(
                ["file", "label", *[f"{kind}_{r}" for r in ranks for kind in ("pred", "prob")]]
            )

    def write(self, names: list[str], labels: list[str], probabilities: Tensor) -> None:
        """One row per image of a batch."""
        values, indices = probabilities.topk(self.top_k, dim=1)
        tops = zip(indices.tolist(), values.tolist(), strict=True)
        for row, (name, label, (top, probs)) in enumerate(zip(names, labels, tops, strict=True)):
            top_names = [self.classes[index] for index in top]
            if "csv" in self.handles:
                pairs = [item for pair in zip(top_names, probs, strict=True) for item in pair]
                cells = [name, label, *pairs]
                self.csv.writerow([_short(item) for item in cells])
            if "jsonl" in self.handles:
                line = {
                    "file": name,
                    "label": label,
                    "top_k": {"labels": top_names, "indices": top, "probabilities": probs},
                    "probabilities": probabilities[row].tolist(),
                }
                self.handles["jsonl"].write(json.dumps(line) + "\n")

    def commit(self) -> list[Path]:
        """Flush every file to disk and give it its name; the files' paths."""
        for handle in self.handles.values():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        for temp, target in zip(self.temps, self.targets, strict=True):
            os.replace(temp, target)
        return list(self.targets)

    def discard(self) -> None:
        """Close and remove the temporary files (a run that stopped or failed)."""
        for handle in self.handles.values():
            handle.close()
        for temp in self.temps:
            temp.unlink(missing_ok=True)


def _temp_of(target: Path) -> Path:
    return target.with_name(f".{target.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}")


def _short(item: str | float) -> str:
    """A CSV cell: a name as text (quoted where a spreadsheet would run it as a formula), a
    probability to 6 significant digits."""
    return text_cell(item) if isinstance(item, str) else f"{item:.6g}"


def write_json(path: Path, record: dict[str, Any]) -> Path:
    """Write a JSON file atomically; its path."""
    temp = _temp_of(path)
    with temp.open("w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    return path


@contextlib.contextmanager
def _rows(
    folder: Path, formats: tuple[Format, ...], classes: tuple[str, ...], top_k: int
) -> Iterator[Rows]:
    """Rows whose files go if the block ends before `commit`."""
    rows = Rows(folder, formats, classes, top_k)
    try:
        yield rows
    finally:
        rows.discard()  # after a commit there is nothing left to remove


@torch.no_grad()
def predict_split(
    predictor: Predictor,
    images: Images,
    *,
    out_dir: Path,
    formats: tuple[Format, ...],
    top_k: int,
    batch_size: int,
    sink: EventSink,
) -> Prediction:
    """Write the predictions of every image (and the confusion matrix, when labelled) to
    `out_dir`, reporting images done as progress; a sink that asks to stop stops it."""
    info, total = predictor.info, len(images)
    labelled = images.classes == info.classes
    k = min(top_k, info.num_classes)
    confusion = torch.zeros(info.num_classes, info.num_classes, dtype=torch.int64)
    top_k_hits, started = 0, time.perf_counter()
    with _rows(out_dir, formats, info.classes, k) as rows:
        for start in range(0, total, batch_size):
            if sink.should_stop():
                return Prediction(start, k, labelled, None, None, [], 0.0, stopped=True)
            stop = min(start + batch_size, total)
            probabilities = predictor.probabilities(images.read(start, stop))
            labels = images.labels[start:stop]
            names = [images.classes[index] for index in labels.tolist()]
            rows.write(images.names[start:stop], names, probabilities)
            if labelled:
                predicted = probabilities.argmax(1)
                confusion += torch.bincount(
                    labels * info.num_classes + predicted, minlength=info.num_classes**2
                ).view_as(confusion)
                hits = probabilities.topk(k, dim=1).indices.eq(labels[:, None]).any(1)
                top_k_hits += int(hits.sum())
            sink.on_progress(stop, total)
        files = rows.commit()
    elapsed = max(time.perf_counter() - started, 1e-9)
    if not labelled:
        return Prediction(total, k, False, None, None, files, total / elapsed, stopped=False)
    matrix = {"classes": list(info.classes), "matrix": confusion.tolist()}
    files.append(write_json(out_dir / CONFUSION, matrix))
    error = 1 - int(confusion.diag().sum()) / total
    top_k_error = 1 - top_k_hits / total
    return Prediction(total, k, True, error, top_k_error, files, total / elapsed, stopped=False)


HEATMAPS = "heatmaps.npz"


def overlay_name(index: int) -> str:
    """The file name of the overlay of the split's image `index` (in file order)."""
    return f"heatmap-{index:05d}.png"


def explain_split(
    model: torch.nn.Module,
    preprocessing: Preprocessing,
    images: Images,
    *,
    out_dir: Path,
    count: int,
    label: bool,
) -> list[Path]:
    """The Grad-CAM of the split's first `count` images (`gradcam.grad_cam`, for each
    image's top class, or with `label` its dataset label): an overlay PNG per image and the
    arrays in `heatmaps.npz` (names, classes, probabilities, maps, upsampled maps)."""
    net = gradcam.explainable(model)
    device = next(net.parameters()).device
    normalise = Normalise(preprocessing, device, channels_last=False)
    count = min(count, len(images))
    batch = images.read(0, count)
    wanted: list[int | None] = images.labels[:count].tolist() if label else [None] * count
    heatmaps = gradcam.grad_cam(net, normalise(batch.to(device)), wanted)
    files = []
    for index, (image, heatmap) in enumerate(zip(batch.numpy(), heatmaps.upsampled, strict=True)):
        target = out_dir / overlay_name(index)
        temp = _temp_of(target)
        gradcam.overlay(image, heatmap).save(temp, format="PNG")
        os.replace(temp, target)
        files.append(target)
    arrays = out_dir / HEATMAPS
    temp = _temp_of(arrays).with_suffix(".npz")
    np.savez_compressed(
        temp,
        files=np.array(images.names[:count]),
        classes=np.array(heatmaps.classes),
        probabilities=np.array(heatmaps.probabilities, dtype=np.float32),
        heatmaps=heatmaps.maps,
        upsampled=heatmaps.upsampled,
        layer=np.array(heatmaps.layer),
    )
    os.replace(temp, arrays)
    return [*files, arrays]
