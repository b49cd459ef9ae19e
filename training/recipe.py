"""The papers' recipe as small pure functions: budget, optimizer, learning rate, warm-up."""

from __future__ import annotations

import math

import torch
from torch import nn

import models
from training.specs import ModelSpec, RecipeSpec

PAPER_ITERATIONS = 64_000  # 2015 Sec. 4.2: stop at 64k iterations


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


def make_optimizer(recipe: RecipeSpec, model: nn.Module) -> torch.optim.Optimizer:
    """SGD (the papers'), Nesterov SGD or AdamW, with weight decay on every parameter."""
    params = model.parameters()
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
    """Set every parameter group's learning rate."""
    for group in optimizer.param_groups:
        group["lr"] = lr
