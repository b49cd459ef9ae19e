"""Admission budgets: a train job's net, memory and compute, estimated before it runs.

`check_train` compares a spec's estimates (`models.estimate`: counted on small nets on the
meta device, nothing built at full size) with the budgets in the settings. The service
checks every job spec on submission with the shape its dataset spec implies; the worker
checks again with the data it loaded (an ImageFolder's size and classes are known only
then).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable
from dataclasses import dataclass

import models
from core.errors import InvalidError
from core.settings import Settings
from training.recipe import total_iterations
from training.specs import (
    DatasetSpec,
    DigitsSpec,
    ImageFolderSpec,
    ModelSpec,
    SyntheticSpec,
    TrainSpec,
)

# channels, image size, classes, training images (before the validation hold-out).
_FIXED: dict[str, tuple[int, int, int, int]] = {
    "cifar10": (3, 32, 10, 50_000),
    "cifar100": (3, 32, 100, 50_000),
    "mnist": (1, 28, 10, 60_000),
    "fashion_mnist": (1, 28, 10, 60_000),
    "digits": (1, 8, 10, 1_797),
}
EVALUATE_BATCH = 512  # the batch of an evaluation (`training.runs.evaluate_checkpoint`)
BYTES_PER_VALUE = 4  # float32: mixed precision keeps less, so the estimate is an upper one
# Copies of the parameters a step keeps: weights, gradients, then per optimizer its state.
_STATE_COPIES = {"sgd": 3, "nesterov": 3, "adamw": 4}


@dataclass(frozen=True)
class DataShape:
    """What a net's costs depend on in the data: image size, channels, classes, images."""

    channels: int
    image_size: int
    num_classes: int
    train_images: int | None  # None: unknown before the data is read


def shape_of(dataset: DatasetSpec) -> DataShape:
    """The data shape a dataset spec implies; an ImageFolder's unknowns are guessed small."""
    fixed: tuple[int, int, int, int]
    if isinstance(dataset, SyntheticSpec):
        fixed = (dataset.channels, dataset.image_size, dataset.num_classes, dataset.train_size)
    elif isinstance(dataset, ImageFolderSpec):
        # Its first image gives the size, its folders the classes: the worker checks those.
        return DataShape(3, dataset.image_size or 32, 2, dataset.train_limit)
    else:
        fixed = _FIXED[dataset.name]
    channels, size, classes, total = fixed
    if isinstance(dataset, DigitsSpec):
        total = total - math.ceil(total * dataset.test_fraction)
    images = total - round(total * dataset.validation)
    if dataset.train_limit is not None:
        images = min(images, dataset.train_limit)
    return DataShape(channels, size, classes, images)


@dataclass(frozen=True)
class Costs:
    """A run's estimates: the net's parameters, its training memory and its compute."""

    params: int
    memory_bytes: int
    macs: float
    iterations: int | None


def costs(spec: TrainSpec, shape: DataShape) -> Costs:
    """The estimates of `spec` on data of `shape`."""
    recipe = spec.recipe
    found = models.estimate(
        spec.model.name,
        num_classes=shape.num_classes,
        in_channels=shape.channels,
        input_size=shape.image_size,
        **spec.model.options,
    )
    state = found.params * BYTES_PER_VALUE * _STATE_COPIES[recipe.optimizer]
    memory = recipe.batch_size * found.activation_bytes + state
    iterations = None
    if recipe.epochs is None or shape.train_images is not None:
        per_epoch = max(1, (shape.train_images or 0) // recipe.batch_size)
        iterations = total_iterations(recipe, per_epoch)
    macs = float(found.macs) * recipe.batch_size * (iterations or 0)
    return Costs(found.params, memory, macs, iterations)


def family(spec: TrainSpec, shape: DataShape) -> Hashable:
    """What `costs` counts once for nets of every depth: `models.estimate` counts a net from
    nets of one and two units per stage, the same for each depth of a family (its stem,
    block, unit, options and stages) on one data shape. A study's distinct families are
    what its admission costs; its depths add nothing."""
    arch = models.resolve(spec.model.name, **spec.model.options)
    ones = dataclasses.replace(arch, layers=(1,) * len(arch.layers))
    return (ones, shape.channels, shape.image_size, shape.num_classes)


def check_train(spec: TrainSpec, shape: DataShape, settings: Settings) -> Costs:
    """The estimates of `spec`, or `InvalidError` naming the first budget it exceeds, its
    value and the estimate."""
    found = costs(spec, shape)
    size = shape.image_size
    net = f"{spec.model.name} on {size}x{size}x{shape.channels} images"
    if found.params > settings.max_model_params:
        raise InvalidError(
            f"model {spec.model.name} has {found.params:,} parameters, over MAX_MODEL_PARAMS "
            f"= {settings.max_model_params:,}; choose a smaller net",
            field=("body", "model", "name"),
        )
    if found.memory_bytes > settings.max_train_memory_bytes:
        raise InvalidError(
            f"training {net} at batch {spec.recipe.batch_size} needs an estimated "
            f"{_gib(found.memory_bytes)} of memory, over MAX_TRAIN_MEMORY_BYTES = "
            f"{_gib(settings.max_train_memory_bytes)}; lower recipe.batch_size or the image "
            "size, or choose a smaller net",
            field=("body", "recipe", "batch_size"),
        )
    if found.macs > settings.max_job_macs:
        raise InvalidError(
            f"training {net} for {found.iterations:,} iterations at batch "
            f"{spec.recipe.batch_size} is an estimated {found.macs:.3g} MACs (forward MACs x "
            f"batch x iterations), over MAX_JOB_MACS = {settings.max_job_macs:.3g}; lower "
            "recipe.iterations (or epochs) or batch_size, or choose a smaller net",
            field=("body", "recipe", "iterations"),
        )
    return found


def check_evaluate(net: ModelSpec, shape: DataShape, settings: Settings) -> None:
    """`InvalidError` when evaluating `net` on data of `shape` (the evaluation's images,
    the net's classes) needs more memory than the budget."""
    found = models.estimate(
        net.name,
        num_classes=shape.num_classes,
        in_channels=shape.channels,
        input_size=shape.image_size,
        **net.options,
    )
    # Activations as training keeps them: more than a forward pass holds, an upper bound.
    memory = EVALUATE_BATCH * found.activation_bytes + found.params * BYTES_PER_VALUE
    if memory > settings.max_train_memory_bytes:
        size = shape.image_size
        raise InvalidError(
            f"evaluating {net.name} on {size}x{size}x{shape.channels} images at "
            f"batch {EVALUATE_BATCH} needs an estimated {_gib(memory)} of memory, over "
            f"MAX_TRAIN_MEMORY_BYTES = {_gib(settings.max_train_memory_bytes)}; evaluate on "
            "smaller images (dataset.image_size)",
            field=("body", "dataset"),
        )


def _gib(count: int) -> str:
    gib = count / 1024**3
    return f"{gib:,.0f} GiB" if gib >= 100 else f"{gib:.3g} GiB"
