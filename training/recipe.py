"""The papers' recipe as small pure functions: budget, optimizer, learning rate, warm-up,
and the defaults that depend on the data and the device (augmentation, memory format).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

import models
from training.data import DatasetInfo
from training.specs import (
    PAPER_ITERATIONS,
    AugmentationRecipe,
    DatasetSpec,
    ImageFolderSpec,
    ModelSpec,
    RecipeSpec,
    TrainSpec,
)

# The smallest input that `augmentation: auto` treats as a photo rather than a thumbnail.
PHOTO_SIZE = 64


def total_iterations(recipe: RecipeSpec, batches_per_epoch: int) -> int:
    """The budget in iterations, from iterations or epochs (default: the paper's 64k)."""
    if recipe.epochs is not None:
        return max(1, round(recipe.epochs * batches_per_epoch))
    return recipe.iterations or PAPER_ITERATIONS


def uses_paper_warmup(recipe: RecipeSpec, model: ModelSpec) -> bool:
    """Whether lr starts at 0.01 until training error falls below 80%.

    The 2015 paper warms up ResNet-110 (and deeper); the 2016 paper warms up all its
    CIFAR runs, which `auto` takes to mean every net with a 2016 unit or shortcut variant.
    """
    if recipe.warmup != "auto":
        return recipe.warmup == "paper"
    arch = models.resolve(model.name, **model.options)
    wiring_2016 = arch.unit.unit != "original" or arch.unit.shortcut_variant != "identity"
    return arch.depth >= 110 or wiring_2016


def learning_rate(recipe: RecipeSpec, step: int, total: int, *, warming_up: bool) -> float:
    """The learning rate at iteration `step` of `total` (nanoGPT's `get_lr`)."""
    if warming_up:
        return recipe.warmup_lr
    if recipe.warmup == "linear" and step < recipe.warmup_iterations:
        return recipe.lr * (step + 1) / recipe.warmup_iterations
    progress = step / total
    if recipe.schedule == "multistep":
        passed = sum(progress >= m for m in recipe.milestones)
        return recipe.lr * recipe.gamma**passed
    if recipe.schedule == "cosine":
        return recipe.lr * 0.5 * (1 + math.cos(math.pi * progress))
    if recipe.schedule == "onecycle":
        # Up from lr/25 over the first 30%, then down to about zero (Smith's one-cycle).
        if progress < 0.3:
            return recipe.lr * (0.04 + 0.96 * progress / 0.3)
        return recipe.lr * 0.5 * (1 + math.cos(math.pi * (progress - 0.3) / 0.7))
    return recipe.lr


def warmup_over(recipe: RecipeSpec, step: int, train_error: float) -> bool:
    """The paper's warm-up ends once training error is below 80%, or after the cap."""
    return train_error < recipe.warmup_error or step >= recipe.warmup_iterations


def make_optimizer(
    recipe: RecipeSpec, model: nn.Module, groups: list[dict[str, Any]] | None = None
) -> torch.optim.Optimizer:
    """SGD (the papers'), Nesterov SGD or AdamW, with weight decay on every parameter.

    `groups` (a fine-tune's) are parameter groups, each trained at its `lr_scale` times the lr.
    """
    params = groups if groups is not None else model.parameters()
    if recipe.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.SGD(
        params,
        lr=recipe.lr,
        momentum=recipe.momentum,
        weight_decay=recipe.weight_decay,
        nesterov=recipe.optimizer == "nesterov",
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's learning rate (times the group's `lr_scale`, if any)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def augment_pad(recipe: RecipeSpec, image_size: tuple[int, int]) -> int:
    """Pixels of zero padding a side: as given, or the papers' 4 at 32 scaled to the image."""
    if recipe.augment_pad != "auto":
        return recipe.augment_pad
    # size / 8 rounded half up (28 -> 4, 20 -> 3, 8 -> 1), at least 1, at most the spec's 32.
    return min(max((min(image_size) + 4) // 8, 1), 32)


def augment_flip(recipe: RecipeSpec, dataset: DatasetSpec) -> bool:
    """Whether to flip: as given, or where the dataset says a mirror image keeps its class."""
    if recipe.augment_flip != "auto":
        return recipe.augment_flip
    return dataset.flip_keeps_label


def augmentation_recipe(
    recipe: RecipeSpec, dataset: DatasetSpec, info: DatasetInfo
) -> AugmentationRecipe:
    """The augmentation recipe: as given, or by the dataset's kind: photos of an ImageFolder
    (an input of 64 pixels or more) take RandomResizedCrop, the field's standard for them;
    CIFAR-sized and other small images the papers' pad-and-crop."""
    if recipe.augmentation != "auto":
        return recipe.augmentation
    photos = isinstance(dataset, ImageFolderSpec) and min(info.image_size) >= PHOTO_SIZE
    return "random_resized_crop" if photos else "cifar"


def default_channels_last(device: torch.device) -> bool:
    """Whether channels_last is the faster memory format to train in on `device`.

    On CUDA it is (the tensor cores' convolutions take it). On a 2-core AVX2 CPU, torch
    2.14, batch 128, it was faster in every case measured, 1-channel inputs included:
    ResNet-20 and ResNet-56 at 3x32x32 and 1x28x28 on 1 thread, 1.14x to 1.25x the images/s
    of NCHW (`python -m bench.train_throughput --models resnet20 resnet56 --inputs 3x32x32
    1x28x28 --steps 10 --warmup 3 --threads 1`), and ResNet-20 on 2 threads, 1.31x at
    3x32x32 and 1.07x at 1x28x28 (the same without `--threads 1`).
    """
    return device.type in ("cuda", "cpu")


def resolve_defaults(
    spec: TrainSpec, info: DatasetInfo, device: torch.device, *, resumed: RecipeSpec | None = None
) -> TrainSpec:
    """`spec` with its data- and device-dependent defaults replaced by the values used.

    A resumed run keeps the augmentation its checkpoint recorded wherever `spec` leaves it
    to the defaults, so it goes on with the batches it started with.
    """
    recipe = spec.recipe
    if resumed is not None:
        kept = {
            field: getattr(resumed, field)
            for field in ("augment_pad", "augment_flip", "augmentation")
            if getattr(recipe, field) == "auto"
        }
        recipe = recipe.model_copy(update=kept)
    channels_last = recipe.channels_last
    used = {
        "augment_pad": augment_pad(recipe, info.image_size),
        "augment_flip": augment_flip(recipe, spec.dataset),
        "augmentation": augmentation_recipe(recipe, spec.dataset, info),
        "channels_last": (
            default_channels_last(device) if channels_last is None else channels_last
        ),
    }
    return spec.model_copy(update={"recipe": recipe.model_copy(update=used)})


def describe_augmentation(given: RecipeSpec, used: TrainSpec) -> str:
    """One line on the augmentation `used`, and why where `given` left it to the defaults."""
    recipe = used.recipe
    if not recipe.augment:
        return "augmentation: off"
    chosen = recipe.augmentation + (" (as given)" if given.augmentation != "auto" else "")
    if recipe.augmentation == "cifar":
        chosen += f", pad {recipe.augment_pad}" + (
            " (as given)" if given.augment_pad != "auto" else ""
        )
    elif recipe.pca_lighting:
        chosen += f", PCA lighting {recipe.pca_lighting}"
    flip = "flip" if recipe.augment_flip else "no flip"
    keeps_label = used.dataset.flip_keeps_label
    if given.augment_flip != "auto":
        flip += " (as given)"
    elif recipe.augment_flip == keeps_label:
        effect = "keeps" if keeps_label else "changes"
        flip += f" ({used.dataset.name}: a flip {effect} the label)"
    else:
        flip += " (as the resumed run started)"
    return f"augmentation: {chosen}, {flip}"
