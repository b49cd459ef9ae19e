"""The papers' experiments as study presets, each at a quick scale and at the papers' scale.

A preset is one figure or table of He et al. 2015 ("Deep Residual Learning") or 2016
("Identity Mappings"). `Preset.plan` expands it into a study's base train spec, grid and
seeds; `Preset.paper_number` gives the papers' number for a cell, as a fraction.

`Preset.claims` are the orderings its paper states between its cells (plain-56 above
plain-44 in training error, full pre-activation below every other unit in test error), which
`results.claims` tests on a study's seeds.

`quick` trains a 6,000-image subset for at most 300 iterations, with a warm-up and a
cosine decay, so that 3 seeds of every cell finish on a 2-core CPU in about 20 minutes
(`quick_minutes` estimates it); `paper` is the papers' CIFAR-10 recipe and depths, for GPU
workers. The ImageNet preset trains on an image folder the user names, at 64x64 pixels
quickly and at the paper's 224x224 crops and 600k iterations on a GPU.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import models
from core.errors import InvalidError
from core.studies.significance import Claim, Relation
from training.specs import PAPER_ITERATIONS

Scale = Literal["quick", "paper"]
Metric = Literal["final_test_error", "best_test_error", "final_train_error"]
Cell = dict[str, Any]

SCALES: tuple[Scale, ...] = ("quick", "paper")
BATCH_SIZE = 128
QUICK_TRAIN_LIMIT = 6_000  # a Fashion-MNIST or CIFAR-10 subset a CPU trains in minutes
QUICK_DATASETS = ("fashion_mnist", "cifar10", "imagefolder")
# A short run's peak lr, half the papers' 0.1 (see QUICK_WHY), and its linear warm-up as a
# fraction of its iterations (the share the engine's one-cycle schedule ramps over).
QUICK_LR = 0.05
WARMUP_FRACTION = 0.3
# The 2015 paper's ImageNet runs: up to 60e4 iterations of batch 256 on 1.28M images, with
# the scale augmentation and "the standard color augmentation" of AlexNet (Sec. 3.4).
IMAGENET_ITERATIONS = 600_000
IMAGENET_TRAIN_IMAGES = 1_281_167
IMAGENET_AUGMENTATION: dict[str, Any] = {"augmentation": "imagenet_scale", "pca_lighting": 0.1}
IMAGENET_NETS = ["plain18", "plain34", "resnet18", "resnet34"]


@dataclass(frozen=True)
class Plan:
    """What a preset expands to: the study request's parts."""

    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int]
    name: str
    tags: list[str]


@dataclass(frozen=True)
class Layout:
    """One scale of a preset: the net every cell starts from, the grid and the recipe."""

    model: dict[str, Any]
    grid: dict[str, list[Any]]
    recipe: dict[str, Any]
    # Dataset fields the scale sets, together, where the user's dataset gives none of them
    # (image_size and resize: one given alone keeps the dataset's default for the other).
    dataset: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] | None = None  # None: what the job's compute implies


def _no_numbers(_cell: Cell) -> float | None:
    return None


@dataclass(frozen=True)
class Preset:
    """One of the papers' figures or tables as a study, at a quick and a paper scale."""

    name: str
    title: str
    source: str
    description: str
    metric: Metric
    note: str
    quick_datasets: tuple[str, ...]
    quick: Layout
    paper: Layout
    numbers: Callable[[Cell], float | None] = _no_numbers
    quick_why: str = ""  # this preset's own reason for its quick recipe
    datasets: tuple[str, ...] = ()  # the only datasets it trains on, at both scales; (): any
    claims: tuple[Claim, ...] = ()  # the orderings its paper states between its cells

    def layout(self, scale: Scale) -> Layout:
        """The net, grid and recipe of `scale`."""
        if scale == "quick":
            return self.quick
        if scale == "paper":
            return self.paper
        raise InvalidError(
            f"scale {scale!r} is unknown; scales are {', '.join(SCALES)}", field=("body", "scale")
        )

    def plan(self, *, dataset: dict[str, Any], scale: Scale, seeds: int | list[int]) -> Plan:
        """The study on `dataset` at `scale`: base spec, grid and seeds, name and tags."""
        layout = self.layout(scale)
        self._check_dataset(dataset)
        data = copy.deepcopy(dataset)
        if not set(layout.dataset) & set(data):
            data.update(copy.deepcopy(layout.dataset))
        if scale == "quick" and data.get("train_limit") is None:
            data["train_limit"] = QUICK_TRAIN_LIMIT
        # The papers' final runs train on the whole training split (their 45k/5k split
        # only chose the schedule); a study reads test error, and at the quick scale a
        # validation pass would cost as much as the test pass.
        data.setdefault("validation", 0)
        base = {
            "model": copy.deepcopy(layout.model),
            "dataset": data,
            "recipe": copy.deepcopy(layout.recipe),
        }
        if layout.resources is not None:
            base["resources"] = copy.deepcopy(layout.resources)
        return Plan(
            base=base,
            grid=copy.deepcopy(layout.grid),
            seeds=_seeds(seeds),
            name=f"{self.title} ({scale}, {data.get('name', 'dataset')})",
            tags=[f"preset:{self.name}", f"scale:{scale}"],
        )

    def _check_dataset(self, dataset: dict[str, Any]) -> None:
        """Refuse a dataset the preset does not train on, naming the ones it does."""
        if self.datasets and dataset.get("name") not in self.datasets:
            raise InvalidError(
                f"preset {self.name!r} trains on {' or '.join(self.datasets)}, not "
                f"{dataset.get('name')!r}",
                field=("body", "dataset", "name"),
            )

    def paper_number(self, cell: dict[str, Any]) -> float | None:
        """The papers' number for a cell (a fraction), or None where they give none."""
        return self.numbers(cell)

    def described(self) -> dict[str, Any]:
        """What a list of presets shows of it: its source, what it shows, its metric and
        quick datasets, and its recipe at each scale in words."""
        return {
            "name": self.name,
            "title": self.title,
            "source": self.source,
            "description": self.description,
            "metric": self.metric,
            "note": self.note,
            "quick_datasets": list(self.quick_datasets),
            "recipe": {scale: self.recipe_note(scale) for scale in SCALES},
        }

    def recipe_note(self, scale: Scale) -> str:
        """The recipe of `scale` in words: budget, warm-up, schedule, and what differs."""
        layout = self.layout(scale)
        recipe = layout.recipe
        if scale == "quick":
            augmentation = _augmentation_note(recipe, layout.dataset)
            return _quick_note(recipe, augmentation) + (
                f" {self.quick_why}" if self.quick_why else ""
            )
        if recipe.get("augmentation") == "imagenet_scale":
            return _imagenet_note(recipe, layout.dataset)
        return _paper_note(recipe)


def _seeds(seeds: int | list[int]) -> list[int]:
    """A count n as seeds 0..n-1; a list as given (distinct non-negative integers)."""
    if isinstance(seeds, list):
        valid = all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        if seeds and valid and len(set(seeds)) == len(seeds):
            return list(seeds)
    elif not isinstance(seeds, bool) and seeds >= 1:
        return list(range(seeds))
    raise InvalidError(
        f"seeds must be a count of at least 1 or a list of distinct non-negative integers; "
        f"got {seeds!r}",
        field=("body", "seeds"),
    )


# --- Recipes -----------------------------------------------------------------------------

QUICK_WHY = (
    "Changed from the paper: its lr 0.1 from the first step, divided by 10 at 50% and 75% "
    "of the budget, does not suit a short run. On 6,000 Fashion-MNIST images for 4 epochs "
    "(188 iterations) ResNet-56 spiked at lr 0.1 and the lr dropped before it recovered, "
    "ending at 70% training error against plain-56's 51% and plain-20's 25%; a linear "
    "warm-up to 0.1 over the first 21 of 70 iterations and a cosine decay still left it "
    "spiking (loss 2.8 to 4.7 over steps 11-20) and at 81% training error at step 50, "
    "where a deep net's spike has no time to settle. So a short run peaks at half the "
    "papers' lr, after a warm-up over its first 30%, then decays along a cosine; every cell "
    "has the same recipe, so the cells stay comparable."
)


def _quick_recipe(iterations: int, *, evaluations: int = 2, **extra: Any) -> dict[str, Any]:
    """A short run: a linear warm-up to QUICK_LR over the first 30%, then a cosine to 0."""
    every = iterations // evaluations
    return {
        "iterations": iterations,
        "batch_size": BATCH_SIZE,
        "lr": QUICK_LR,
        "schedule": "cosine",
        "warmup": "linear",
        "warmup_iterations": round(iterations * WARMUP_FRACTION),
        "log_every": 10,  # the last training error is the mean of the last 10 steps
        "eval_every": every,  # a test pass costs about 20 training steps here
        "checkpoint_every": every,
        **extra,
    }


def _paper_recipe(*, warmup: Literal["auto", "paper"] = "auto", **extra: Any) -> dict[str, Any]:
    """The papers' CIFAR recipe: 64k iterations, lr 0.1 divided by 10 at 32k and 48k."""
    return {
        "iterations": PAPER_ITERATIONS,
        "batch_size": BATCH_SIZE,
        "lr": 0.1,
        "schedule": "multistep",
        "milestones": [0.5, 0.75],
        "warmup": warmup,
        **extra,
    }


def _imagenet_recipe() -> dict[str, Any]:
    """The 2015 paper's ImageNet recipe (Sec. 3.4): batch 256, 600k iterations, lr 0.1 / 10."""
    return {
        "iterations": IMAGENET_ITERATIONS,
        "batch_size": 256,
        "lr": 0.1,
        "momentum": 0.9,
        "weight_decay": 1e-4,
        "schedule": "multistep",
        # The paper divides lr by 10 when the error plateaus: at about 30, 60 and 90 of its
        # 120 epochs (Fig. 4), which fixed fractions of the budget stand in for.
        "milestones": [0.25, 0.5, 0.75],
        "warmup": "off",
        **IMAGENET_AUGMENTATION,
    }


def _augmentation_note(recipe: Mapping[str, Any], dataset: Mapping[str, Any]) -> str:
    """The training augmentation of a recipe, in words."""
    if recipe.get("augmentation") != "imagenet_scale":
        return "The papers' augmentation (4-pixel pad, random crop, flip)"
    size = dataset["image_size"]
    low, high = round(size * 256 / 224), round(size * 480 / 224)
    return (
        "The 2015 paper's ImageNet augmentation scaled to the input: the shorter side "
        f"resized at random in [{low}, {high}] pixels, a random {size}x{size} crop, flips, "
        f"PCA colour noise {recipe['pca_lighting']}"
    )


def _quick_note(recipe: Mapping[str, Any], augmentation: str) -> str:
    iterations, warmup = recipe["iterations"], recipe["warmup_iterations"]
    epochs = iterations * recipe["batch_size"] / QUICK_TRAIN_LIMIT
    tests = [
        str(step) for step in range(recipe["eval_every"], iterations + 1, recipe["eval_every"])
    ]
    passes = f"iterations {', '.join(tests)}" if len(tests) > 1 else "the end"
    diagnostics = recipe.get("diagnostics_every")
    return " ".join(
        [
            f"{iterations} iterations of batch {recipe['batch_size']} (about {epochs:.1f} "
            f"epochs of the default {QUICK_TRAIN_LIMIT:,}-image subset; a train_limit you give "
            "is kept, and the budget stays in iterations, so the time does not grow with it).",
            f"SGD, momentum 0.9, weight decay 1e-4; lr rises linearly to {recipe['lr']} over "
            f"the first {warmup} iterations, then follows the run's cosine (from "
            f"{0.5 * (1 + math.cos(math.pi * warmup / iterations)):.0%} of the peak there) "
            "down to zero.",
            f"{augmentation}; no validation hold-out; test error at {passes}.",
            *(
                [f"Per-unit responses are recorded every {diagnostics} iterations."]
                if diagnostics
                else []
            ),
            QUICK_WHY,
        ]
    )


def _paper_note(recipe: Mapping[str, Any]) -> str:
    warmup = {
        "auto": "nets of 110 layers and more start at lr 0.01 until training error is below "
        "80% (at most 400 iterations), as the 2015 paper warmed up ResNet-110",
        "paper": "every run starts at lr 0.01 until training error is below 80% (at most 400 "
        "iterations), as all the 2016 paper's CIFAR runs",
    }[recipe["warmup"]]
    diagnostics = recipe.get("diagnostics_every")
    return " ".join(
        [
            f"The papers' recipe: {recipe['iterations']:,} iterations of batch "
            f"{recipe['batch_size']} (about 164 epochs of CIFAR-10's 50,000 images), SGD "
            "with momentum 0.9 and weight decay 1e-4, lr 0.1 divided by 10 at 32k and 48k "
            f"iterations; {warmup}.",
            "Augmentation: 4-pixel pad, random 32x32 crop, horizontal flip. Trained on the "
            "whole training split, as the papers' final runs (their 45k/5k split only chose "
            "the schedule); test error after every epoch.",
            *(
                [f"Per-unit responses are recorded every {diagnostics:,} iterations."]
                if diagnostics
                else []
            ),
            "Meant for GPU workers: on the 2-core CPU one ResNet-110 run takes over a day.",
        ]
    )


def _imagenet_note(recipe: Mapping[str, Any], dataset: Mapping[str, Any]) -> str:
    """The ImageNet paper scale in words."""
    iterations, batch = recipe["iterations"], recipe["batch_size"]
    epochs = iterations * batch / IMAGENET_TRAIN_IMAGES
    drops = ", ".join(f"{round(m * iterations / 1000)}k" for m in recipe["milestones"])
    return " ".join(
        [
            f"The 2015 paper's ImageNet recipe: {iterations:,} iterations of batch {batch} "
            f"(about {epochs:.0f} epochs of ImageNet's 1.28M training images), SGD with "
            f"momentum {recipe['momentum']} and weight decay 1e-4, lr "
            f"{recipe['lr']} divided by 10 at {drops} iterations (the paper divides it when "
            "the error plateaus, at about 30, 60 and 90 epochs; fixed milestones stand in); "
            "no warm-up.",
            _augmentation_note(recipe, dataset) + " (2015 Sec. 3.4). Trained on the whole "
            "train/ tree; val/ is the test split, with test error after every epoch, from the "
            f"centre {dataset['image_size']}x{dataset['image_size']} crop of each image "
            f"resized to a shorter side of {dataset['resize']} (the checkpoint's "
            "preprocessing), where the paper's numbers are 10-crop.",
            "Meant for GPU workers: every cell asks for one.",
        ]
    )


# --- The papers' numbers (shared/PAPERS.md), as fractions ---------------------------------

# 2015 Table 6, test error with option A shortcuts. ResNet-110: 6.61, the mean of 5 runs
# (the best of them 6.43), nearer a median over seeds than the best run is.
TABLE6 = {
    "resnet20": 0.0875,
    "resnet32": 0.0751,
    "resnet44": 0.0717,
    "resnet56": 0.0697,
    "resnet110": 0.0661,
    "resnet1202": 0.0793,
}

# 2016 Table 1, ResNet-110: each shortcut's options and error; None where the paper
# reports "fail" (error above 20%).
TABLE1: tuple[tuple[dict[str, Any], float | None], ...] = (
    ({"shortcut_variant": "identity"}, 0.0661),
    ({"shortcut_variant": "constant_scaling", "shortcut_scale": 0, "residual_scale": 1}, None),
    ({"shortcut_variant": "constant_scaling", "shortcut_scale": 0.5, "residual_scale": 1}, None),
    (
        {"shortcut_variant": "constant_scaling", "shortcut_scale": 0.5, "residual_scale": 0.5},
        0.1235,
    ),
    ({"shortcut_variant": "exclusive_gating", "gate_bias": 0}, None),
    ({"shortcut_variant": "exclusive_gating", "gate_bias": -6}, 0.0870),
    ({"shortcut_variant": "exclusive_gating", "gate_bias": -7}, 0.0981),
    ({"shortcut_variant": "shortcut_only_gating", "gate_bias": 0}, 0.1286),
    ({"shortcut_variant": "shortcut_only_gating", "gate_bias": -6}, 0.0691),
    ({"shortcut_variant": "conv1x1"}, 0.1222),
    ({"shortcut_variant": "dropout", "shortcut_dropout": 0.5}, None),
)

# 2016 Table 2 (and Table 3, which repeats its original and full pre-activation rows):
# test error by unit, for ResNet-110 and ResNet-164.
TABLE2 = {
    "resnet110": {
        "original": 0.0661,
        "bn_after_add": 0.0817,
        "relu_before_add": 0.0784,
        "relu_only_preact": 0.0671,
        "full_preact": 0.0637,
    },
    "resnet164": {
        "original": 0.0593,
        "bn_after_add": 0.0650,
        "relu_before_add": 0.0614,
        "relu_only_preact": 0.0591,
        "full_preact": 0.0546,
    },
}


# 2015 Table 2: ImageNet top-1 error (10-crop) on the validation set.
IMAGENET_TABLE2 = {
    "plain18": 0.2794,
    "plain34": 0.2854,
    "resnet18": 0.2788,
    "resnet34": 0.2503,
}


def _by_name(cell: Cell) -> float | None:
    """Table 6: the number of the cell's net."""
    return TABLE6.get(cell.get("model.name", ""))


def _by_imagenet_name(cell: Cell) -> float | None:
    """2015 Table 2: the number of the cell's ImageNet net."""
    return IMAGENET_TABLE2.get(cell.get("model.name", ""))


def _by_shortcut(cell: Cell) -> float | None:
    """Table 1: the number of the row whose options the cell's are."""
    options = cell.get("model.options")
    return next((number for row, number in TABLE1 if row == options), None)


def _by_unit(cell: Cell) -> float | None:
    """Table 2: the cell's unit at its depth; ResNet-110's where the grid has no depth axis."""
    column = TABLE2.get(cell.get("model.name", "resnet110"), {})
    return column.get(cell.get("model.options.unit", ""))


# --- The papers' claims, as orderings between cells ---------------------------------------


def _chain(axis: str, values: list[Any], relation: Relation, metric: str) -> tuple[Claim, ...]:
    """Each value against the next: `values[0] relation values[1]`, and so on down."""
    return tuple(
        Claim({axis: first}, relation, {axis: second}, metric)
        for first, second in itertools.pairwise(values)
    )


def _against_each(
    axis: str, value: Any, relation: Relation, others: list[Any], metric: str
) -> tuple[Claim, ...]:
    """`value relation other` for each of `others` (an extreme: best, or worst, of all)."""
    return tuple(
        Claim({axis: value}, relation, {axis: other}, metric) for other in others if other != value
    )


UNITS = tuple(TABLE2["resnet110"])
# 2015 Fig. 6 (and Fig. 1): deeper plain nets train worse; with shortcuts, depth pays.
DEGRADATION_CLAIMS = (
    *_chain("model.name", ["plain110", "plain56", "plain44", "plain32", "plain20"], ">",
            "final_train_error"),
    Claim({"model.name": "resnet56"}, "<", {"model.name": "plain56"}, "final_train_error"),
    Claim({"model.name": "resnet110"}, "<", {"model.name": "plain110"}, "final_train_error"),
    # The quick scale's budget is too short for it (its note says so): the paper scale only.
    Claim({"model.name": "resnet56"}, "<", {"model.name": "resnet20"}, "final_train_error",
          scales=("paper",)),
)  # fmt: skip
# 2015 Table 2 and Fig. 4.
IMAGENET_CLAIMS = (
    Claim({"model.name": "plain34"}, ">", {"model.name": "plain18"}, "final_test_error"),
    Claim({"model.name": "plain34"}, ">", {"model.name": "plain18"}, "final_train_error"),
    Claim({"model.name": "resnet34"}, "<", {"model.name": "resnet18"}, "final_test_error"),
    Claim({"model.name": "resnet34"}, "<", {"model.name": "plain34"}, "final_test_error"),
)
# 2015 Table 3: B beats A slightly, C beats B marginally.
SHORTCUT_OPTION_CLAIMS = _chain("model.options.shortcut", ["C", "B", "A"], "<", "final_test_error")
# 2015 Table 6: test error falls with depth up to ResNet-110; ResNet-1202 overfits.
CIFAR_DEPTH_CLAIMS = (
    *_chain("model.name", ["resnet110", "resnet56", "resnet44", "resnet32", "resnet20"], "<",
            "final_test_error"),
    Claim({"model.name": "resnet1202"}, ">", {"model.name": "resnet110"}, "final_test_error"),
)  # fmt: skip
# 2016 Table 1: the identity shortcut beats every variant; the dropout shortcut fails.
SHORTCUT_VARIANT_CLAIMS = tuple(
    Claim({"model.options": TABLE1[0][0]}, "<", {"model.options": row}, "final_test_error")
    for row, _ in TABLE1[1:]
)
# 2016 Table 2: full pre-activation is best, BN after the addition worst, ReLU before the
# addition worse than the original unit.
UNIT_CLAIMS = (
    *_against_each("model.options.unit", "full_preact", "<", list(UNITS), "final_test_error"),
    *_against_each("model.options.unit", "bn_after_add", ">", list(UNITS[:-1]),
                   "final_test_error"),
    Claim({"model.options.unit": "relu_before_add"}, ">", {"model.options.unit": "original"},
          "final_test_error"),
)  # fmt: skip
# 2016 Table 3.
PREACT_CLAIMS = (
    Claim({"model.options.unit": "full_preact"}, "<", {"model.options.unit": "original"},
          "final_test_error"),
)  # fmt: skip

# --- The presets, in the papers' order ----------------------------------------------------

DEPTHS = (20, 32, 44, 56)
SMALL_NET_NOTE = (
    "The quick scale trains a 6,000-image subset for at most 300 iterations, not "
    "CIFAR-10's 50,000 images for 64k: its errors sit well above the papers' and only the "
    "ordering of the cells carries over."
)

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="degradation",
            title="Plain against residual nets as depth grows",
            source="He et al. 2015, Fig. 6 (CIFAR-10; also Fig. 1)",
            description=(
                "Plain nets (the same layers without shortcuts) against residual nets of "
                "20, 32, 44 and 56 layers (and 110 at the paper scale). The figure is about "
                "training error: deeper plain nets train worse, which is the degradation "
                "problem and not overfitting, while deeper residual nets train better. Read "
                "the median final training error down each family: it rises with depth for "
                "the plain nets and holds or falls for the residual ones; plain-56 against "
                "resnet56 is the widest gap."
            ),
            metric="final_train_error",
            claims=DEGRADATION_CLAIMS,
            note=(
                "Fig. 6 plots error curves and prints no table, so no cell has a paper "
                "number: the paper states only that plain-110's error is above 60% (a bound) "
                "and the residual nets' test errors are Table 6's (the cifar_depth preset). "
                + SMALL_NET_NOTE
            ),
            quick_datasets=QUICK_DATASETS,
            quick=Layout(
                model={"name": "plain20"},
                grid={"model.name": [f"{f}{d}" for f in ("plain", "resnet") for d in DEPTHS]},
                recipe=_quick_recipe(70, evaluations=1),
            ),
            paper=Layout(
                model={"name": "plain20"},
                grid={
                    "model.name": [f"{f}{d}" for f in ("plain", "resnet") for d in (*DEPTHS, 110)]
                },
                recipe=_paper_recipe(),
            ),
            quick_why=(
                "Eight nets share the 20 minutes, so each run is short and has one test "
                "pass, at the end: the figure's measure is the training error, which every "
                "10 steps record. Look for the plain nets' error rising with depth and the "
                "gap at 56 layers; at this budget the residual nets do not yet improve with "
                "depth, which needs the paper scale."
            ),
        ),
        Preset(
            name="imagenet_degradation",
            title="Plain against residual nets on ImageNet, 18 and 34 layers",
            source="He et al. 2015, Table 2 and Fig. 4 (ImageNet)",
            description=(
                "Plain nets of 18 and 34 layers against residual nets of the same layers, "
                "with the ImageNet stem (a 7x7/2 conv and a 3x3/2 max pool). The deeper "
                "plain net is the worse one, 28.54% top-1 error against plain-18's 27.94%, "
                "with the higher training error all through training (Fig. 4 left): the "
                "degradation problem on ImageNet. With shortcuts depth pays: ResNet-34 "
                "ends at 25.03% against ResNet-18's 27.88%, and ResNet-18 converges faster "
                "than plain-18 to about the same error (Fig. 4 right). The dataset is an "
                "imagefolder whose path you give: at the paper scale ImageNet's train/ and "
                "val/ trees (one folder per class), val/ read as the test split."
            ),
            metric="final_test_error",
            claims=IMAGENET_CLAIMS,
            note=(
                "The numbers are Table 2's top-1 errors on ImageNet's validation set, "
                "10-crop; the study's test error is one centre crop of each val/ image, a "
                "little above that (an evaluate job with view ten_crop on a cell's "
                "checkpoint gives the paper's measure). Table 2's ResNets have "
                "option A shortcuts (zero-padding, no extra parameters); these take the "
                "zoo's ImageNet default, option B (projections where dimensions grow), "
                "because a grid crosses every net with every option and plain nets take "
                "none: Table 3 puts ResNet-34 with B half a point below A (24.52% against "
                "25.03%). The quick scale trains 6,000 images of a small folder at 64x64 "
                "pixels for 200 iterations, not 1.28M images at 224x224 for 600k: its "
                "errors are far above the papers', which are shown beside its cells as a "
                "reference, not a target."
            ),
            quick_datasets=("imagefolder",),
            quick=Layout(
                model={"name": "plain18"},
                grid={"model.name": list(IMAGENET_NETS)},
                recipe=_quick_recipe(200, evaluations=1, batch_size=32, **IMAGENET_AUGMENTATION),
                dataset={"image_size": 64},
            ),
            paper=Layout(
                model={"name": "plain18"},
                grid={"model.name": list(IMAGENET_NETS)},
                recipe=_imagenet_recipe(),
                dataset={"image_size": 224, "resize": 256},
                resources={"device": "gpu", "gpus": 1},
            ),
            numbers=_by_imagenet_name,
            quick_why=(
                "Four ImageNet nets share the 20 minutes, so each cell is 200 iterations of "
                "batch 32 on 64x64 crops, tested once, at the end. Give it a small folder of "
                "natural images (10 classes of ImageNet, Imagenette, say): every image of "
                "the folder is read before training, so a whole ImageNet tree is too slow "
                "for this scale. Look for plain-34 ending worse than plain-18 and each "
                "residual net's test error below its plain counterpart's."
            ),
            datasets=("imagefolder",),
        ),
        Preset(
            name="shortcut_options",
            title="Shortcut options A, B and C",
            source="He et al. 2015, Table 3 (ImageNet ResNet-34); here on CIFAR nets",
            description=(
                "One CIFAR net with each shortcut option: A, zero-padding identity "
                "shortcuts where dimensions grow (no extra parameters); B, projections "
                "where dimensions grow, identity elsewhere; C, projections everywhere. On "
                "ImageNet B beat A slightly (the zero-padded channels learn no residual) "
                "and C beat B marginally (extra parameters), so the paper keeps A or B: "
                "projections are not essential to the degradation fix. Expect differences "
                "within the seeds' spread."
            ),
            metric="final_test_error",
            claims=SHORTCUT_OPTION_CLAIMS,
            note=(
                "Table 3 compares the options on ImageNet with ResNet-34 (top-1 error, "
                "10-crop; option A 25.03%), which is not comparable with a CIFAR-sized "
                "net's test error, so no cell has a paper number. The paper scale runs "
                "ResNet-56 and ResNet-110 on CIFAR-10; the quick scale ResNet-32. " + SMALL_NET_NOTE
            ),
            quick_datasets=QUICK_DATASETS,
            quick=Layout(
                model={"name": "resnet32"},
                grid={"model.options.shortcut": ["A", "B", "C"]},
                recipe=_quick_recipe(270),
            ),
            paper=Layout(
                model={"name": "resnet56"},
                grid={
                    "model.name": ["resnet56", "resnet110"],
                    "model.options.shortcut": ["A", "B", "C"],
                },
                recipe=_paper_recipe(),
            ),
        ),
        Preset(
            name="cifar_depth",
            title="Residual nets from 20 to 1202 layers on CIFAR-10",
            source="He et al. 2015, Table 6",
            description=(
                "Residual nets of 20, 32, 44 and 56 layers (and 110 and 1202 at the paper "
                "scale), option A shortcuts. Test error falls with depth up to ResNet-110 "
                "(6.61%); ResNet-1202 trains as well but tests worse (7.93%), which the "
                "paper puts down to overfitting a small dataset. The metric is the final "
                "test error, because Table 6 reports the error at the end of the 64k "
                "iterations, picking no checkpoint on the test set (a run's best test "
                "error would). ResNet-110's number is 6.61%, the mean of the paper's 5 runs "
                "(its best run 6.43%), nearer a median over seeds."
            ),
            metric="final_test_error",
            claims=CIFAR_DEPTH_CLAIMS,
            note=(
                "The numbers are CIFAR-10's; on another dataset (the quick scale's default "
                "is Fashion-MNIST) they are a reference for the ordering, not a target. "
                + SMALL_NET_NOTE
            ),
            quick_datasets=QUICK_DATASETS,
            quick=Layout(
                model={"name": "resnet20"},
                grid={"model.name": [f"resnet{d}" for d in DEPTHS]},
                recipe=_quick_recipe(160),
            ),
            paper=Layout(
                model={"name": "resnet20"},
                grid={"model.name": [f"resnet{d}" for d in (*DEPTHS, 110, 1202)]},
                recipe=_paper_recipe(),
            ),
            numbers=_by_name,
        ),
        Preset(
            name="responses",
            title="Layer responses of plain and residual nets",
            source="He et al. 2015, Fig. 7 (CIFAR-10)",
            description=(
                "The standard deviation of each unit's residual branch output, recorded as "
                "diag/response_std/<i> (unit i counted from the input) every "
                "diagnostics_every iterations, for plain and residual nets of 20 and 56 "
                "layers (and ResNet-110 at the paper scale). Residual nets respond less "
                "than plain nets of the same depth, and deeper residual nets less again: "
                "the residual functions stay nearer zero, as the paper's reformulation "
                "argues. Read each net's last recorded responses against the unit index."
            ),
            metric="final_train_error",
            note=(
                "Fig. 7 plots the responses of every 3x3 layer (after BN, before the "
                "nonlinearity) on the test set of trained nets; the engine records the "
                "output of each unit's last BN, before the addition, on the training batch "
                "of the diagnostic step (BN in training mode), so compare shapes, not "
                "values. The figure has no numbers, so no cell has one. " + SMALL_NET_NOTE
            ),
            quick_datasets=QUICK_DATASETS,
            quick=Layout(
                model={"name": "plain20"},
                grid={"model.name": ["plain20", "plain56", "resnet20", "resnet56"]},
                recipe=_quick_recipe(160, diagnostics_every=16),
            ),
            paper=Layout(
                model={"name": "plain20"},
                grid={"model.name": ["plain20", "plain56", "resnet20", "resnet56", "resnet110"]},
                recipe=_paper_recipe(diagnostics_every=1_000),
            ),
        ),
        Preset(
            name="shortcut_variants",
            title="What happens to the shortcut: scaling, gating, 1x1 convs, dropout",
            source="He et al. 2016, Table 1 (CIFAR-10, ResNet-110)",
            description=(
                "The shortcut of every unit replaced by each of the paper's variants, one "
                "cell per row of Table 1; a cell's model.options are the row's settings "
                "(shortcut / residual branch: constant scaling, exclusive gating 1-g / g, "
                "shortcut-only gating 1-g / 1, 1x1 convolution, dropout 0.5). Anything "
                "multiplying the shortcut hampers the signal's direct path, and the "
                'identity shortcut trains best (6.61%). Rows the paper marks "fail" '
                "(test error above 20%) have no paper number: constant scaling 0 / 1 and "
                "0.5 / 1, exclusive gating with bias 0 (the paper: 0 to -5) and the "
                "dropout shortcut."
            ),
            metric="final_test_error",
            claims=SHORTCUT_VARIANT_CLAIMS,
            note=(
                "Table 1's numbers are ResNet-110's on CIFAR-10, shown beside every scale's "
                "cells; the quick scale runs a 20-layer net, whose 9 units attenuate a "
                "scaled or gated shortcut far less than ResNet-110's 54, so expect smaller "
                "gaps. " + SMALL_NET_NOTE
            ),
            quick_datasets=QUICK_DATASETS,
            quick=Layout(
                model={"name": "resnet20"},
                grid={
                    "model.options": [copy.deepcopy(TABLE1[i][0]) for i in (0, 2, 3, 5, 7, 9, 10)]
                },
                recipe=_quick_recipe(140),
            ),
            paper=Layout(
                model={"name": "resnet110"},
                grid={"model.options": [copy.deepcopy(row) for row, _ in TABLE1]},
                recipe=_paper_recipe(warmup="paper"),
            ),
            numbers=_by_shortcut,
            quick_why="Seven variants share the 20 minutes, so the net is ResNet-20.",
        ),
        Preset(
            name="units",
            title="Where BN and ReLU go in a residual unit",
            source="He et al. 2016, Table 2 (CIFAR-10, ResNet-110 and ResNet-164)",
            description=(
                "The five unit designs: original (ReLU after the addition), BN after the "
                "addition, ReLU before the addition, ReLU-only pre-activation, and full "
                "pre-activation (BN and ReLU before each weight layer). BN after the "
                "addition impedes the shortcut's signal and is worst; ReLU before the "
                "addition makes the residual non-negative and also hurts; full "
                "pre-activation is best, by more at 164 layers than at 110."
            ),
            metric="final_test_error",
            claims=UNIT_CLAIMS,
            note=(
                "The numbers are CIFAR-10's; the quick scale runs ResNet-32 and shows "
                "ResNet-110's numbers beside its cells. " + SMALL_NET_NOTE
            ),
            quick_datasets=QUICK_DATASETS,
            quick=Layout(
                model={"name": "resnet32"},
                grid={"model.options.unit": list(TABLE2["resnet110"])},
                recipe=_quick_recipe(140),
            ),
            paper=Layout(
                model={"name": "resnet110"},
                grid={
                    "model.name": ["resnet110", "resnet164"],
                    "model.options.unit": list(TABLE2["resnet110"]),
                },
                recipe=_paper_recipe(warmup="paper"),
            ),
            numbers=_by_unit,
        ),
        Preset(
            name="preact",
            title="Original against full pre-activation units",
            source="He et al. 2016, Table 3 (CIFAR-10)",
            description=(
                "The original unit (ReLU after the addition) against full pre-activation "
                "(BN and ReLU before each weight layer, an identity path from unit to "
                "unit), on ResNet-110 (basic units) and ResNet-164 (bottleneck units) at "
                "the paper scale: 6.61% -> 6.37% and 5.93% -> 5.46%. Pre-activation eases "
                "optimisation, most at great depth, and regularises through BN on every "
                "weight layer's input: the paper's pre-activation ResNet-164 ends with a "
                "slightly higher training loss and a lower test error, so read the final "
                "training error beside the test error."
            ),
            metric="final_test_error",
            claims=PREACT_CLAIMS,
            note=(
                "Table 3 also has ResNet-1001 (7.61% -> 4.92%), left out for its cost "
                "(27 hours on 2 GPUs in 2016). The quick scale runs ResNet-56 and shows "
                "ResNet-110's numbers beside its cells. " + SMALL_NET_NOTE
            ),
            quick_datasets=QUICK_DATASETS,
            quick=Layout(
                model={"name": "resnet56"},
                grid={"model.options.unit": ["original", "full_preact"]},
                recipe=_quick_recipe(250),
            ),
            paper=Layout(
                model={"name": "resnet110"},
                grid={
                    "model.name": ["resnet110", "resnet164"],
                    "model.options.unit": ["original", "full_preact"],
                },
                recipe=_paper_recipe(warmup="paper"),
            ),
            numbers=_by_unit,
        ),
    )
}


def get(name: str) -> Preset:
    """The preset called `name`, or `InvalidError` listing the presets there are."""
    try:
        return PRESETS[name]
    except KeyError:
        raise InvalidError(
            f"preset {name!r} is unknown; presets are {', '.join(PRESETS)}",
            field=("body", "preset"),
        ) from None


# --- What the quick scale costs ------------------------------------------------------------

# Training throughput on the 2-core CPU the quick scale is sized for, as seconds per image:
# a fixed part plus a part per multiply-accumulate, a least-squares line through measured
# training steps at batch 128 (ResNet-20: 475/s at 28x28 gray, 390/s at 32x32 RGB;
# ResNet-56: 200/s and 150/s), within 3% of each.
CPU_SECONDS_PER_IMAGE = 0.62e-3
CPU_SECONDS_PER_MAC = 4.74e-11
EVAL_SPEEDUP = 4  # a forward pass at batch 512 without gradients, against a training step
JOB_SECONDS = 8  # a job's own start: a fresh process, imports, data, the net's MAC count
# Channels, image size and test images of each dataset; an image folder is taken as CIFAR
# at the size its preset gives it, if any.
INPUTS: dict[str, tuple[int, int, int]] = {
    "fashion_mnist": (1, 28, 10_000),
    "mnist": (1, 28, 10_000),
    "cifar10": (3, 32, 10_000),
    "cifar100": (3, 32, 10_000),
}


def cpu_images_per_s(macs: float) -> float:
    """Training images/s on 2 CPU cores for a net of `macs` multiply-accumulates per image."""
    return 1 / (CPU_SECONDS_PER_IMAGE + CPU_SECONDS_PER_MAC * macs)


def quick_minutes(
    preset: Preset,
    *,
    dataset: str | None = None,
    seeds: int = 3,
    images_per_s: Callable[[float], float] = cpu_images_per_s,
) -> float:
    """Minutes one worker takes for the quick scale on `dataset` (default: the preset's
    first): every cell x seed's training steps, test passes and start; `images_per_s` maps
    a net's MACs per image to its training rate."""
    name = dataset or preset.quick_datasets[0]
    plan = preset.plan(dataset={"name": name}, scale="quick", seeds=seeds)
    channels, size, test_images = INPUTS.get(name, INPUTS["cifar10"])
    size = plan.base["dataset"].get("image_size", size)
    seconds = 0.0
    for cell in _cells(plan.grid):
        spec = _with_cell(plan.base, cell)
        model, recipe = spec["model"], spec["recipe"]
        options = model.get("options", {})
        macs = models.describe(model["name"], in_channels=channels, input_size=size, **options)
        rate = images_per_s(float(macs["macs"]))
        passes = math.ceil(recipe["iterations"] / recipe["eval_every"])
        train = recipe["iterations"] * recipe["batch_size"] / rate
        seconds += train + passes * test_images / (EVAL_SPEEDUP * rate) + JOB_SECONDS
    return seconds * len(plan.seeds) / 60


def _cells(grid: Mapping[str, list[Any]]) -> list[Cell]:
    """The grid's cells: the product of its axes, the first varying slowest."""
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def _with_cell(base: Mapping[str, Any], cell: Cell) -> dict[str, Any]:
    """A copy of `base` with each axis (a dotted path) set to the cell's value."""
    spec = copy.deepcopy(dict(base))
    for axis, value in cell.items():
        *parents, leaf = axis.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = copy.deepcopy(value)
    return spec
