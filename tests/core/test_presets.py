"""Study presets: every cell a valid train spec, the papers' numbers, a CPU-sized quick scale."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

import models
from core.errors import InvalidError
from core.kinds import train
from core.resources import ResourcesSpec
from core.settings import Settings
from core.studies import grid, presets
from core.studies.presets import Preset, Scale

DATASETS: dict[Scale, list[dict[str, Any]]] = {
    "quick": [
        {"name": "fashion_mnist"},
        {"name": "cifar10", "train_limit": 5000},
        {"name": "imagefolder", "path": "cifar10-jpeg.tar.gz"},
    ],
    "paper": [{"name": "cifar10"}],
}
# The ImageNet preset trains on an image folder only: ImageNet's tree at the paper scale.
IMAGENET_DATASETS: dict[Scale, list[dict[str, Any]]] = {
    "quick": [{"name": "imagefolder", "path": "photos"}],
    "paper": [{"name": "imagefolder", "path": "imagenet"}],
}
ALL = list(presets.PRESETS.values())
CIFAR = [preset for preset in ALL if not preset.datasets]
IMAGENET = presets.get("imagenet_degradation")


def datasets_for(preset: Preset, scale: Scale) -> list[dict[str, Any]]:
    """The datasets the tests run `preset` on at `scale`."""
    return IMAGENET_DATASETS[scale] if preset.datasets else DATASETS[scale]


def cell_payloads(preset: Preset, scale: Scale, dataset: dict[str, Any]) -> list[dict[str, Any]]:
    """Each cell's train spec payload: the base with every axis's dotted path set."""
    plan = preset.plan(dataset=dataset, scale=scale, seeds=1)
    payloads = []
    for values in itertools.product(*plan.grid.values()):
        payload = copy.deepcopy(plan.base)
        for axis, value in zip(plan.grid, values, strict=True):
            *parents, leaf = axis.split(".")
            node = payload
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        payloads.append(payload)
    return payloads


def paper_numbers(preset: Preset, scale: Scale = "paper") -> dict[str, float | None]:
    """The preset's number for each cell of `scale`, keyed by the cell's values."""
    grid = preset.plan(dataset=datasets_for(preset, scale)[0], scale=scale, seeds=1).grid
    found = {}
    for values in itertools.product(*grid.values()):
        cell = dict(zip(grid, values, strict=True))
        found[" / ".join(map(str, values))] = preset.paper_number(cell)
    return found


@pytest.mark.parametrize("scale", ["quick", "paper"])
@pytest.mark.parametrize("preset", ALL, ids=lambda preset: preset.name)
def test_every_cell_of_every_preset_is_a_valid_train_spec(preset: Preset, scale: Scale) -> None:
    for dataset in datasets_for(preset, scale):
        payloads = cell_payloads(preset, scale, dataset)
        assert len(payloads) >= 2
        for payload in payloads:
            spec = train.KIND.parse({"kind": "train", **payload}, Settings())
            assert spec.dataset.name == dataset["name"]


def test_the_presets_are_the_papers_experiments_in_the_papers_order() -> None:
    assert list(presets.PRESETS) == [
        "degradation",
        "imagenet_degradation",
        "shortcut_options",
        "cifar_depth",
        "responses",
        "shortcut_variants",
        "units",
        "preact",
    ]
    for name, preset in presets.PRESETS.items():
        assert preset.name == name
        assert preset.source.startswith(("He et al. 2015", "He et al. 2016"))
        assert preset.title
        assert preset.description
        assert preset.note
        assert preset.metric in ("final_test_error", "best_test_error", "final_train_error")
        assert preset.quick_datasets[0] == ("imagefolder" if preset.datasets else "fashion_mnist")
        assert preset.recipe_note("quick") != preset.recipe_note("paper")


def test_a_preset_is_described_with_its_recipe_at_each_scale() -> None:
    preset = presets.get("cifar_depth")
    described = preset.described()
    assert (described["name"], described["metric"]) == (preset.name, preset.metric)
    assert described["quick_datasets"] == list(preset.quick_datasets)
    assert described["recipe"] == {scale: preset.recipe_note(scale) for scale in presets.SCALES}


def test_the_grids_hold_the_papers_nets() -> None:
    def names(preset: str, scale: Scale) -> list[Any]:
        plan = presets.get(preset).plan(dataset={"name": "cifar10"}, scale=scale, seeds=1)
        return plan.grid["model.name"]

    depths = (20, 32, 44, 56)
    assert names("degradation", "quick") == [f"{f}{d}" for f in ("plain", "resnet") for d in depths]
    assert {"plain110", "resnet110"} <= set(names("degradation", "paper"))
    assert names("cifar_depth", "paper") == [f"resnet{d}" for d in (*depths, 110, 1202)]
    assert {"plain56", "resnet56"} <= set(names("responses", "quick"))
    assert names("preact", "paper") == names("units", "paper") == ["resnet110", "resnet164"]


def test_paper_numbers_are_the_papers_for_the_cells_that_have_them() -> None:
    assert paper_numbers(presets.get("cifar_depth")) == pytest.approx(
        {
            "resnet20": 0.0875,
            "resnet32": 0.0751,
            "resnet44": 0.0717,
            "resnet56": 0.0697,
            "resnet110": 0.0661,
            "resnet1202": 0.0793,
        }
    )
    table2 = {
        "original": (0.0661, 0.0593),
        "bn_after_add": (0.0817, 0.0650),
        "relu_before_add": (0.0784, 0.0614),
        "relu_only_preact": (0.0671, 0.0591),
        "full_preact": (0.0637, 0.0546),
    }
    expected = {
        f"resnet{depth} / {unit}": numbers[column]
        for column, depth in enumerate((110, 164))
        for unit, numbers in table2.items()
    }
    assert paper_numbers(presets.get("units")) == pytest.approx(expected)
    preact = {key: value for key, value in expected.items() if "original" in key or "full" in key}
    assert paper_numbers(presets.get("preact")) == pytest.approx(preact)
    # A quick grid without a depth axis shows ResNet-110's numbers.
    assert paper_numbers(presets.get("units"), "quick") == pytest.approx(
        {unit: numbers[0] for unit, numbers in table2.items()}
    )


def test_shortcut_variants_give_table_1_and_none_where_the_paper_failed() -> None:
    preset = presets.get("shortcut_variants")
    grid = preset.plan(dataset={"name": "cifar10"}, scale="paper", seeds=1).grid
    found = [
        (options, preset.paper_number({"model.options": options}))
        for options in grid["model.options"]
    ]
    assert [number for _, number in found] == pytest.approx(
        [0.0661, None, None, 0.1235, None, 0.0870, 0.0981, 0.1286, 0.0691, 0.1222, None]
    )
    failed = {options["shortcut_variant"] for options, number in found if number is None}
    assert failed == {"constant_scaling", "exclusive_gating", "dropout"}
    assert "fail" in preset.description
    assert preset.paper_number({"model.options": {"shortcut_variant": "conv1x1"}}) == 0.1222
    assert preset.paper_number({"model.options": {"shortcut_variant": "gate"}}) is None


@pytest.mark.parametrize("name", ["degradation", "shortcut_options", "responses"])
def test_figures_and_imagenet_tables_give_no_number(name: str) -> None:
    preset = presets.get(name)
    for scale in ("quick", "paper"):
        assert set(paper_numbers(preset, scale).values()) == {None}
    assert "no cell has" in preset.note


def test_seeds_are_a_count_or_a_list() -> None:
    preset = presets.get("cifar_depth")
    assert preset.plan(dataset={"name": "digits"}, scale="quick", seeds=3).seeds == [0, 1, 2]
    assert preset.plan(dataset={"name": "digits"}, scale="quick", seeds=[7, 2]).seeds == [7, 2]
    for bad in (0, [], [1, 1], [-1]):
        with pytest.raises(InvalidError) as refused:
            preset.plan(dataset={"name": "digits"}, scale="quick", seeds=bad)
        assert refused.value.field == ("body", "seeds")


def test_an_unknown_preset_or_scale_is_refused_with_the_choices() -> None:
    with pytest.raises(InvalidError) as refused:
        presets.get("resnet9000")
    assert refused.value.field == ("body", "preset")
    assert "'resnet9000'" in refused.value.message
    assert all(name in refused.value.message for name in presets.PRESETS)
    with pytest.raises(InvalidError, match="quick, paper"):
        presets.get("units").plan(dataset={"name": "cifar10"}, scale="huge", seeds=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("preset", CIFAR, ids=lambda preset: preset.name)
def test_the_quick_scale_trains_a_subset_with_a_warmup_and_a_short_schedule(
    preset: Preset,
) -> None:
    plan = preset.plan(dataset={"name": "fashion_mnist"}, scale="quick", seeds=3)
    recipe, dataset = plan.base["recipe"], plan.base["dataset"]
    assert dataset == {"name": "fashion_mnist", "train_limit": 6000, "validation": 0}
    assert recipe["warmup"] == "linear"
    assert 0 < recipe["warmup_iterations"] < recipe["iterations"] <= 300
    assert recipe["schedule"] == "cosine"
    assert recipe["iterations"] % recipe["eval_every"] == 0
    assert plan.tags == [f"preset:{preset.name}", "scale:quick"]
    note = preset.recipe_note("quick")
    assert f"{recipe['iterations']} iterations" in note
    assert "warm-up" in note
    given = preset.plan(
        dataset={"name": "cifar10", "train_limit": 2000, "validation": 0.2}, scale="quick", seeds=1
    )
    assert given.base["dataset"] == {"name": "cifar10", "train_limit": 2000, "validation": 0.2}


@pytest.mark.parametrize("preset", CIFAR, ids=lambda preset: preset.name)
def test_the_paper_scale_is_the_papers_recipe(preset: Preset) -> None:
    plan = preset.plan(dataset={"name": "cifar10"}, scale="paper", seeds=5)
    recipe = plan.base["recipe"]
    assert plan.base["dataset"] == {"name": "cifar10", "validation": 0}
    assert recipe["iterations"] == 64_000
    assert recipe["batch_size"] == 128
    assert (recipe["lr"], recipe["schedule"], recipe["milestones"]) == (
        0.1,
        "multistep",
        [0.5, 0.75],
    )
    # The 2016 paper warms up every CIFAR run; the 2015 paper ResNet-110 and deeper (auto).
    assert recipe["warmup"] == ("paper" if "2016" in preset.source else "auto")
    assert "64,000 iterations" in preset.recipe_note("paper")


def test_a_plan_is_a_copy_the_caller_may_change() -> None:
    preset = presets.get("shortcut_variants")
    dataset = {"name": "cifar10"}
    plan = preset.plan(dataset=dataset, scale="quick", seeds=1)
    plan.base["recipe"]["lr"] = 5.0
    plan.grid["model.options"][0]["gate_bias"] = 3
    assert dataset == {"name": "cifar10"}
    again = preset.plan(dataset=dataset, scale="quick", seeds=1)
    assert again.base["recipe"]["lr"] == presets.QUICK_LR
    assert "gate_bias" not in again.grid["model.options"][0]


def test_the_cpu_throughput_model_matches_the_measured_rates() -> None:
    def rate(name: str, channels: int, size: int) -> float:
        macs = models.describe(name, in_channels=channels, input_size=size)["macs"]
        return presets.cpu_images_per_s(float(macs))

    assert 450 <= rate("resnet20", 1, 28) <= 500
    assert rate("resnet56", 1, 28) == pytest.approx(200, rel=0.05)
    assert rate("resnet20", 3, 32) == pytest.approx(390, rel=0.05)
    assert rate("resnet56", 3, 32) == pytest.approx(150, rel=0.05)


@pytest.mark.parametrize("preset", CIFAR, ids=lambda preset: preset.name)
def test_three_seeds_of_the_quick_scale_take_about_20_minutes_on_the_cpu(
    preset: Preset,
) -> None:
    fashion = presets.quick_minutes(preset)
    assert 12 <= fashion <= 21
    assert presets.quick_minutes(preset, dataset="cifar10") <= 26
    # The estimate counts every cell x seed at its own net's rate.
    assert presets.quick_minutes(preset, seeds=1) == pytest.approx(fashion / 3)
    twice = presets.quick_minutes(
        preset, images_per_s=lambda macs: 2 * presets.cpu_images_per_s(macs)
    )
    starts = len(cell_payloads(preset, "quick", {"name": "fashion_mnist"})) * 3
    assert twice == pytest.approx(
        (fashion - starts * presets.JOB_SECONDS / 60) / 2 + starts * presets.JOB_SECONDS / 60
    )


def test_the_imagenet_preset_is_table_2s_four_imagenet_nets_at_both_scales() -> None:
    for scale in presets.SCALES:
        plan = IMAGENET.plan(dataset=IMAGENET_DATASETS[scale][0], scale=scale, seeds=1)
        assert plan.grid == {"model.name": ["plain18", "plain34", "resnet18", "resnet34"]}
        assert {models.resolve(name).stem for name in plan.grid["model.name"]} == {"imagenet"}
        assert plan.base["recipe"]["augmentation"] == "imagenet_scale"
        assert plan.base["dataset"]["path"] == IMAGENET_DATASETS[scale][0]["path"]


def test_the_imagenet_quick_scale_is_admitted_as_cpu_jobs_on_small_photos() -> None:
    plan = IMAGENET.plan(dataset=IMAGENET_DATASETS["quick"][0], scale="quick", seeds=2)
    assert plan.base["dataset"] == {
        "name": "imagefolder",
        "path": "photos",
        "image_size": 64,
        "train_limit": 6000,
        "validation": 0,
    }
    recipe = plan.base["recipe"]
    assert 100 <= recipe["iterations"] <= 300
    assert (recipe["warmup"], recipe["schedule"]) == ("linear", "cosine")
    # A study's cells pass admission where grid.expand validates each one as a job spec.
    expanded = grid.expand(
        plan.base,
        plan.grid,
        plan.seeds,
        settings=Settings(),
        name=plan.name,
        tags=plan.tags,
        max_jobs=100,
    )
    assert len(expanded.jobs) == 8
    for _cell, _seed, spec in expanded.jobs:
        assert spec.resources == ResourcesSpec(device="any", gpus=0)
        assert (spec.dataset.name, spec.recipe.augmentation) == ("imagefolder", "imagenet_scale")
    assert "[73, 137] pixels, a random 64x64 crop" in IMAGENET.recipe_note("quick")
    given = IMAGENET.plan(
        dataset={"name": "imagefolder", "path": "p", "image_size": 96}, scale="quick", seeds=1
    )
    assert given.base["dataset"]["image_size"] == 96  # the user's fields are kept
    sized = IMAGENET.plan(
        dataset={"name": "imagefolder", "path": "p", "image_size": 320}, scale="paper", seeds=1
    )
    # A size of one's own keeps the dataset's default resize, which a crop of 320 fits.
    assert "resize" not in sized.base["dataset"]
    train.KIND.parse(cell_payloads(IMAGENET, "paper", sized.base["dataset"])[0], Settings())


def test_three_seeds_of_the_imagenet_quick_scale_take_about_20_minutes_on_the_cpu() -> None:
    # Image folders are counted with CIFAR's 10,000 test images, at the preset's 64x64.
    minutes = presets.quick_minutes(IMAGENET)
    assert 12 <= minutes <= 23
    assert presets.quick_minutes(IMAGENET, seeds=1) == pytest.approx(minutes / 3)


def test_the_imagenet_paper_scale_is_the_papers_recipe_on_gpu_workers() -> None:
    plan = IMAGENET.plan(dataset=IMAGENET_DATASETS["paper"][0], scale="paper", seeds=1)
    assert plan.base["dataset"] == {
        "name": "imagefolder",
        "path": "imagenet",
        "image_size": 224,
        "resize": 256,
        "validation": 0,
    }
    recipe = plan.base["recipe"]
    assert {k: recipe[k] for k in ("iterations", "batch_size", "lr", "momentum")} == {
        "iterations": 600_000,
        "batch_size": 256,
        "lr": 0.1,
        "momentum": 0.9,
    }
    assert (recipe["weight_decay"], recipe["schedule"]) == (1e-4, "multistep")
    assert recipe["milestones"] == [0.25, 0.5, 0.75]
    assert recipe["warmup"] == "off"
    for payload in cell_payloads(IMAGENET, "paper", IMAGENET_DATASETS["paper"][0]):
        spec = train.KIND.parse(payload, Settings())
        assert spec.resources == ResourcesSpec(device="gpu", gpus=1)
        assert spec.recipe.augmentation == "imagenet_scale"
    note = IMAGENET.recipe_note("paper")
    assert "600,000 iterations of batch 256" in note
    assert "150k, 300k, 450k" in note
    assert "val/ is the test split" in note
    assert "224x224 crop of each image resized to a shorter side of 256" in note
    assert "val/ read as the test split" in IMAGENET.description


@pytest.mark.parametrize("scale", ["quick", "paper"])
def test_the_imagenet_cells_show_table_2s_10_crop_errors(scale: Scale) -> None:
    assert paper_numbers(IMAGENET, scale) == pytest.approx(
        {"plain18": 0.2794, "plain34": 0.2854, "resnet18": 0.2788, "resnet34": 0.2503}
    )
    assert "10-crop" in IMAGENET.note
    assert "not a target" in IMAGENET.note


def test_the_imagenet_preset_refuses_a_dataset_other_than_an_image_folder() -> None:
    with pytest.raises(InvalidError) as refused:
        IMAGENET.plan(dataset={"name": "cifar10"}, scale="paper", seeds=1)
    assert refused.value.field == ("body", "dataset", "name")
    assert "trains on imagefolder, not 'cifar10'" in refused.value.message
