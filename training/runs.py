"""Entry points that the CLI and the worker call: train a spec, evaluate a checkpoint."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import models
from training import checkpoints
from training.data import DatasetInfo, LoadedDataset, Split, TensorSplit
from training.datasets import load_dataset
from training.evaluate import Evaluation, evaluate
from training.events import EventSink
from training.loop import build_model, fit
from training.pipeline import make_batches
from training.preprocess import Preprocessing, preprocessing_of
from training.ranks import Ranks
from training.specs import DatasetSpec, ImageFolderSpec, ModelSpec, TrainSpec
from training.views import View, evaluate_views


def train(
    spec: TrainSpec,
    *,
    data_root: Path,
    out_dir: Path,
    sink: EventSink,
    device: torch.device | None = None,
    download: bool = False,
    resume: bool = True,
    prepare: Callable[[LoadedDataset], None] | None = None,
    free_margin: int = checkpoints.FREE_MARGIN_BYTES,
    nproc: int = 1,
    ranks: Ranks | None = None,
) -> dict[str, Any]:
    """Load the spec's dataset, train, and write `spec.json` and `summary.json` to `out_dir`.

    `prepare` sees the loaded dataset before training starts (the service sets the job's
    time limits from it). A checkpoint needs its size plus `free_margin` bytes free.
    `spec.json` is the spec as used, defaults resolved (`fit` writes it). The summary's
    non-finite numbers are None, as JSON has no NaN. With `nproc` > 1 the run spans that
    many processes of this host (`training.distributed`, one device each); `ranks` is
    this process's place in such a run, set by that module.
    """
    if nproc > 1:
        # Imported here: the launcher runs each rank through this function.
        from training import distributed

        return distributed.train(
            spec,
            nproc=nproc,
            data_root=data_root,
            out_dir=out_dir,
            sink=sink,
            device=device,
            download=download,
            resume=resume,
            prepare=prepare,
            free_margin=free_margin,
        )
    main = ranks is None or ranks.is_main
    if ranks is not None:
        spec = _spec_of_rank_0(spec, ranks)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = _load(spec, data_root, download, ranks)
    if prepare is not None and main:
        prepare(data)
    fitted = fit(
        spec,
        data,
        out_dir=out_dir,
        sink=sink,
        device=device,
        resume=resume,
        free_margin=free_margin,
        ranks=ranks,
    )
    summary: dict[str, Any] = json_safe(fitted)
    if main:
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _spec_of_rank_0(spec: TrainSpec, ranks: Ranks) -> TrainSpec:
    """Rank 0's spec, on every rank: ranks that trained specs of their own (another host
    given other options) would wait on each other's collectives until the timeout."""
    shared = ranks.share(spec.model_dump(mode="json", include=set(TrainSpec.model_fields)))
    return spec if ranks.is_main else TrainSpec.model_validate(shared)


def _load(spec: TrainSpec, data_root: Path, download: bool, ranks: Ranks | None) -> LoadedDataset:
    """The spec's dataset; of several ranks, rank 0 downloads it before the others read it."""
    if ranks is None or not download:
        return load_dataset(spec.dataset, data_root=data_root, download=download)
    data = load_dataset(spec.dataset, data_root=data_root, download=True) if ranks.is_main else None
    torch.distributed.barrier()
    return data or load_dataset(spec.dataset, data_root=data_root, download=False)


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


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
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    trained = load_trained_model(path, sha256=sha256, device=device)
    model, trained_on = trained.model, trained.info
    if isinstance(dataset, ImageFolderSpec):
        dataset = dataset.model_copy(update={"in_memory": False})
    data = load_dataset(dataset, data_root=data_root, download=download)
    if prepare is not None:  # the service records the data read
        prepare(data)
    if data.info.classes != trained_on.classes or data.info.channels != trained_on.channels:
        raise ValueError(
            f"checkpoint was trained on {trained_on.name} ({trained_on.num_classes} classes, "
            f"{trained_on.channels} channels); {data.info.name} has {data.info.num_classes} "
            f"classes and {data.info.channels} channels"
        )
    split = data.split(dataset.split)
    if len(split) == 0:
        raise ValueError(f"the {dataset.split} split of {data.info.name} is empty")
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
