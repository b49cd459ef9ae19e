"""A job's resources: filled in by the rule, stored as used, and routed to their queue."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from core import resources
from core.kinds import EvaluateJobSpec, TrainJobSpec
from core.resources import ResourcesSpec
from core.studies import presets
from tests.core.test_presets import cell_payloads, datasets_for

DIGITS = {"model": {"name": "resnet20"}, "dataset": {"name": "digits"}}


def _train(**fields: Any) -> TrainJobSpec:
    return TrainJobSpec.model_validate({**DIGITS, **fields})


def test_a_small_job_asks_for_any_device_and_the_stored_spec_says_so() -> None:
    spec = _train(recipe={"epochs": 1})
    assert spec.resources == ResourcesSpec(device="any", gpus=0)
    assert spec.model_dump(mode="json")["resources"] == {"device": "any", "gpus": 0}
    assert TrainJobSpec.model_validate(spec.model_dump(mode="json")) == spec


@pytest.mark.parametrize(
    ("model", "wanted"),
    [
        ("resnet20", ("any", 0)),  # 3.3e14 MACs: about six hours of a 2-core CPU
        ("resnet56", ("gpu", 1)),  # the paper's 64k iterations of deeper nets: a GPU
        ("resnet110", ("gpu", 1)),
        ("preact_resnet164", ("gpu", 1)),
    ],
)
def test_the_default_follows_the_paper_runs_compute(model: str, wanted: tuple[str, int]) -> None:
    spec = TrainJobSpec.model_validate({"model": {"name": model}, "dataset": {"name": "cifar10"}})
    assert (spec.resources.device, spec.resources.gpus) == wanted


def test_imagenet_nets_at_224_pixels_default_to_a_gpu() -> None:
    dataset = {"name": "imagefolder", "path": "imagenet", "image_size": 224, "train_limit": 1000}
    big = TrainJobSpec.model_validate({"model": {"name": "resnet50"}, "dataset": dataset})
    assert big.resources == ResourcesSpec(device="gpu", gpus=1)
    short = {"iterations": 10, "batch_size": 8}
    small = TrainJobSpec.model_validate({**big.model_dump(), "resources": {}, "recipe": short})
    assert small.resources == ResourcesSpec(device="any", gpus=0)


@pytest.mark.parametrize("scale", ["quick", "paper"])
def test_every_preset_is_admitted_and_its_quick_scale_runs_on_a_cpu_worker(
    scale: presets.Scale,
) -> None:
    for preset in presets.PRESETS.values():
        for dataset in datasets_for(preset, scale):
            for payload in cell_payloads(preset, scale, dataset):
                spec = TrainJobSpec.model_validate(payload)
                if scale == "quick":
                    assert spec.resources.gpus == 0, (preset.name, payload)
                assert resources.queue_for(spec.resources.gpus or 0) in ("cpu", "gpu")


@pytest.mark.parametrize(
    ("asked", "filled"),
    [
        ({"device": "cpu"}, ("cpu", 0)),
        ({"device": "gpu"}, ("gpu", 1)),
        ({"device": "any"}, ("any", 0)),
        ({"gpus": 0}, ("any", 0)),
        ({"gpus": 4}, ("gpu", 4)),
        ({"device": "gpu", "gpus": 2}, ("gpu", 2)),
    ],
)
def test_what_is_asked_is_kept_and_the_rest_filled_in(
    asked: dict[str, Any], filled: tuple[str, int]
) -> None:
    spec = _train(resources=asked, recipe={"iterations": 64_000})
    assert (spec.resources.device, spec.resources.gpus) == filled


@pytest.mark.parametrize(
    ("asked", "where", "message"),
    [
        ({"device": "cpu", "gpus": 2}, ["resources"], "device 'cpu' runs on a CPU"),
        ({"device": "any", "gpus": 1}, ["resources"], "ask device 'gpu' for GPUs"),
        ({"device": "gpu", "gpus": 0}, ["resources"], "at least 1"),
        ({"gpus": 9}, ["resources", "gpus"], "less than or equal to 8"),
        ({"gpus": -1}, ["resources", "gpus"], "greater than or equal to 0"),
        ({"device": "tpu"}, ["resources", "device"], "'cpu', 'gpu' or 'any'"),
        ({"memory": 4}, ["resources", "memory"], "Extra inputs"),
    ],
)
def test_contradictions_and_bounds_are_refused(
    asked: dict[str, Any], where: list[str], message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        _train(resources=asked)
    error = caught.value.errors()[0]
    assert list(error["loc"]) == where
    assert message in error["msg"]


def test_an_evaluation_runs_on_one_device_of_any_kind_by_default() -> None:
    base = {"kind": "evaluate", "source_job": str(uuid.uuid4()), "dataset": {"name": "digits"}}
    assert EvaluateJobSpec.model_validate(base).resources == ResourcesSpec(device="any", gpus=0)
    gpu = EvaluateJobSpec.model_validate({**base, "resources": {"device": "gpu"}})
    assert gpu.resources.gpus == 1
    with pytest.raises(ValidationError, match="an evaluation runs on one device"):
        EvaluateJobSpec.model_validate({**base, "resources": {"gpus": 2}})


def test_queues_by_need_and_what_each_worker_consumes() -> None:
    assert [resources.queue_for(n) for n in (0, 1, 2, 8)] == ["cpu", "gpu", "gpu-2", "gpu-8"]
    assert resources.queues_served(0) == ["cpu"]
    assert resources.queues_served(1) == ["cpu", "gpu"]
    assert resources.queues_served(4) == ["cpu", "gpu", "gpu-2", "gpu-3", "gpu-4"]
    assert len(resources.ALL_QUEUES) == resources.MAX_GPUS + 1
    # A spec stored before resources were kept runs anywhere, as it did.
    assert resources.queue_of({"model": {"name": "resnet20"}}) == "cpu"
    assert resources.queue_of({"resources": {"device": "gpu", "gpus": 2}}) == "gpu-2"
