"""Entry points that the CLI and the worker call: train a spec, evaluate a checkpoint."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import models
from training import checkpoints, distributed
from training.data import DatasetInfo, LoadedDataset, Split, TensorSplit
from training.devices import default_device
from training.evaluate import Evaluation, evaluate
from training.evaluation_data import load_for_reading, nonempty_split
from training.events import EventSink
from training.loop import build_model
from training.options import RunOptions
from training.pipeline import make_batches
from training.preprocess import Preprocessing, preprocessing_of
from training.specs import DatasetSpec, ModelSpec, TrainSpec
from training.trainer import json_safe as json_safe  # the kinds' summaries use it too
from training.trainer import train_here
from training.views import View, evaluate_views


def train(
    spec: TrainSpec, options: RunOptions, sink: EventSink, *, nproc: int = 1
) -> dict[str, Any]:
    """Load the spec's dataset, train, and write `spec.json` and `summary.json` to `out_dir`.

    With `nproc` > 1 the run spans that many processes of this host
    (`training.distributed`, one device each).
    """
    if nproc > 1:
        return distributed.train(spec, options, sink, nproc=nproc)
    return train_here(spec, options, sink)


@dataclass(frozen=True)
class Trained:
    """A checkpoint's net in eval mode, its training data's info, its spec as stored, and
    the preprocessing it declares."""

    model: models.ResNet
    info: DatasetInfo
    spec: dict[str, Any]
    preprocessing: Preprocessing


def load_trained_model(
    path: Path, *, sha256: str | None = None, device: torch.device | None = None
) -> Trained:
    """The net of a checkpoint (a run's, or imported weights'), ready to predict.

    Only the spec's model and the data's record are read, so a checkpoint that imported
    weights from elsewhere needs no dataset or recipe.
    """
    saved = checkpoints.load(path, sha256=sha256)
    net = ModelSpec.model_validate(saved["spec"]["model"])
    info = DatasetInfo.from_record(saved["data"])
    model = build_model(net, info)
    model.load_state_dict(saved["model"])
    model = model.to(device or torch.device("cpu")).eval()
    return Trained(model, info, saved["spec"], preprocessing_of(saved))


def evaluate_checkpoint(
    path: Path,
    dataset: DatasetSpec,
    *,
    data_root: Path,
    device: torch.device | None = None,
    tta_flip: bool = False,
    download: bool = False,
    sha256: str | None = None,
    view: View = "center",
    prepare: Callable[[LoadedDataset], None] | None = None,
) -> Evaluation:
    """Evaluate a checkpoint on `dataset.split`, each image made input by the checkpoint's
    declared preprocessing, seen through `view` (centre crop, ten crops, multi-scale).

    An ImageFolder is read from its files, so its photos become input exactly as
    `/predict` makes them. With `sha256`, the file must have it (the service passes the
    database's record).
    """
    device = device or default_device()
    trained = load_trained_model(path, sha256=sha256, device=device)
    model, trained_on = trained.model, trained.info
    data = load_for_reading(dataset, data_root=data_root, download=download, prepare=prepare)
    if data.info.classes != trained_on.classes or data.info.channels != trained_on.channels:
        raise ValueError(
            f"checkpoint was trained on {trained_on.name} ({trained_on.num_classes} classes, "
            f"{trained_on.channels} channels); {data.info.name} has {data.info.num_classes} "
            f"classes and {data.info.channels} channels"
        )
    split = nonempty_split(data, dataset.split)
    check_input_size(split, trained.preprocessing)
    if view != "center":
        result = evaluate_views(
            model,
            split,
            trained.preprocessing,
            view,
            num_classes=trained_on.num_classes,
            device=device,
            tta_flip=tta_flip,
        )
    else:
        # The checkpoint's preprocessing and normalisation, not the evaluation data's.
        batches = make_batches(
            split,
            trained_on,
            batch_size=512,
            device=device,
            augment=False,
            shuffle=False,
            drop_last=False,
            seed=0,
            preprocessing=trained.preprocessing,
        )
        result = evaluate(model, batches, trained_on.num_classes, tta_flip=tta_flip)
    return dataclasses.replace(result, classes=list(trained_on.classes), view=view)


def check_input_size(split: Split, preprocessing: Preprocessing) -> None:
    """Refuse images held as arrays of another size than the net's input (files are
    resized by the preprocessing; arrays are the dataset's own)."""
    if isinstance(split, TensorSplit) and tuple(split.images.shape[2:]) != preprocessing.crop:
        height, width = split.images.shape[2:]
        raise ValueError(
            f"the dataset holds {height}x{width} images; the model takes "
            f"{preprocessing.crop[0]}x{preprocessing.crop[1]}"
        )
