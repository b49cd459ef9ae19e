"""Admission: a spec the service cannot hold or run is a 422 that names the limit, before
anything is built, stored or queued; the papers' own runs stay within every limit."""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.app import create_app
from core import kinds
from core.errors import InvalidError
from core.kinds import TrainJobSpec
from core.kinds.train import budget
from core.settings import Settings
from tests.helpers import TRAIN, make_key, queued_ids, trained_job
from training.datasets import load_dataset

JOBS = "/api/v1/jobs"
BIG = 2**63  # past a Postgres bigint and SQLite's integers too
CIFAR = {"name": "cifar10"}


def _refused(response: Any, *, loc: list[Any] | None = None) -> str:
    """The message of a 422, after checking its location when given."""
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    if loc is not None:
        assert error["details"][0]["loc"] == loc
    message: str = error["message"]
    return message


@contextmanager
def lowered(settings: Settings, **budgets: Any) -> Iterator[TestClient]:
    """A client (read + train key) of the API made with `budgets` in its settings, as a
    deployment sets them."""
    key = make_key(settings.database_url, "read", "train")
    app = create_app(settings.model_copy(update=budgets))
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


@pytest.mark.parametrize(
    ("name", "limit"),
    [("resnet100004", 1202), ("preact_resnet1010", 1001), (f"resnet{2**31 + 4}", 1202)],
)
def test_a_net_deeper_than_the_papers_deepest_is_refused_at_once(
    client: TestClient, queue: redis.Redis, name: str, limit: int
) -> None:
    started = time.monotonic()
    message = _refused(client.post(JOBS, json={**TRAIN, "model": {"name": name}}))
    assert f"depth {int(name.removeprefix('preact_').removeprefix('resnet'))}" in message
    assert f"over the limit of {limit}" in message
    assert queued_ids(queue) == []
    described = client.get(f"/api/v1/models/{name}")
    assert f"over the limit of {limit}" in _refused(described, loc=["path", "name"])
    assert time.monotonic() - started < 5  # nothing was built (ResNet-100004: minutes)


def test_a_long_model_name_is_refused_with_its_length_limit(client: TestClient) -> None:
    name = "resnet" + "0" * 60 + "20"
    message = _refused(client.post(JOBS, json={**TRAIN, "model": {"name": name}}))
    assert "at most 40 characters" in message
    assert "at most 40 characters" in _refused(client.get(f"/api/v1/models/{name}"))


def test_any_valid_name_is_described_and_the_options_route_still_answers(
    client: TestClient,
) -> None:
    deepest = client.get("/api/v1/models/resnet1202")
    assert deepest.status_code == 200, deepest.text
    assert (deepest.json()["depth"], deepest.json()["params"]) == (1202, 19_421_274)
    assert client.get("/api/v1/models/cifar_resnet50").json()["stem"] == "cifar"
    assert "resnet21" in _refused(client.get("/api/v1/models/resnet21"))
    assert client.get("/api/v1/models/options").json()["families"][0] == "resnet"


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"recipe": {"seed": 2**31}}, ["body", "recipe", "seed"]),
        ({"recipe": {"iterations": BIG}}, ["body", "recipe", "iterations"]),
        ({"recipe": {"eval_every": BIG}}, ["body", "recipe", "eval_every"]),
        ({"recipe": {"checkpoint_every": 0}}, ["body", "recipe", "checkpoint_every"]),
        ({"recipe": {"checkpoint_every": BIG}}, ["body", "recipe", "checkpoint_every"]),
        ({"recipe": {"keep_last": 0}}, ["body", "recipe", "keep_last"]),
        ({"recipe": {"keep_last": 101}}, ["body", "recipe", "keep_last"]),
        ({"recipe": {"milestones": [0.5] * 33}}, ["body", "recipe", "milestones"]),
        ({"dataset": {"name": "digits", "train_limit": BIG}}, ["body", "dataset", "train_limit"]),
        ({"dataset": {"name": "digits", "split_seed": BIG}}, ["body", "dataset", "split_seed"]),
        ({"tags": ["x" * 201]}, ["body", "tags", 0]),
    ],
)
def test_every_integer_and_list_of_a_spec_is_bounded(
    client: TestClient, queue: redis.Redis, fields: dict[str, Any], loc: list[Any]
) -> None:
    _refused(client.post(JOBS, json={**TRAIN, **fields}), loc=loc)
    assert queued_ids(queue) == []


def test_huge_numbers_in_model_options_and_checkpoint_steps_are_422(client: TestClient) -> None:
    scaled = {"name": "resnet20", "options": {"shortcut_variant": "constant_scaling"}}
    scaled["options"]["shortcut_scale"] = 10**400  # type: ignore[index]
    assert "shortcut_scale must be within" in _refused(
        client.post(JOBS, json={**TRAIN, "model": scaled})
    )
    evaluate = {"kind": "evaluate", "source_job": str(uuid.uuid4()), "dataset": {"name": "digits"}}
    _refused(client.post(JOBS, json={**evaluate, "checkpoint": BIG}))


def test_checkpoints_are_bounded_in_number_per_run(client: TestClient) -> None:
    every_step = {"iterations": 64_000, "checkpoint_every": 1}
    message = _refused(client.post(JOBS, json={**TRAIN, "recipe": every_step}))
    assert "64,000 checkpoints" in message
    assert "over the limit of 10,000" in message


def test_training_memory_over_its_budget_names_it_the_estimate_and_the_fix(
    client: TestClient, queue: redis.Redis
) -> None:
    spec = {**TRAIN, "model": {"name": "resnet1202"}, "dataset": CIFAR}
    response = client.post(JOBS, json={**spec, "recipe": {"batch_size": 65_536}})
    message = _refused(response)
    assert "resnet1202 on 32x32x3 images at batch 65536" in message
    assert "needs an estimated 5,653 GiB of memory" in message
    assert "over MAX_TRAIN_MEMORY_BYTES = 128 GiB" in message
    assert "lower recipe.batch_size" in message
    assert queued_ids(queue) == []


def test_compute_over_its_budget_names_it_and_the_estimate(client: TestClient) -> None:
    recipe = {"batch_size": 1024, "iterations": 10_000_000}
    spec = {**TRAIN, "model": {"name": "resnet1202"}, "dataset": CIFAR, "recipe": recipe}
    message = _refused(client.post(JOBS, json=spec))
    assert "for 10,000,000 iterations at batch 1024" in message
    assert "over MAX_JOB_MACS = 1e+19" in message
    # ResNet-1202: 2.83G MACs per 32x32 image.
    assert f"{2_829_238_912 * 1024 * 10_000_000:.3g} MACs" in message


def test_parameters_over_a_lowered_budget_are_refused(settings: Settings) -> None:
    with lowered(settings, max_model_params=1_000_000) as client:
        message = _refused(client.post(JOBS, json={**TRAIN, "model": {"name": "resnet110"}}))
        # 1,727,962 parameters on RGB images; digits are gray, so the first conv is smaller.
        assert "resnet110 has 1,727,674 parameters, over MAX_MODEL_PARAMS = 1,000,000" in message
        assert client.post(JOBS, json=TRAIN).status_code == 202


def test_an_evaluation_over_the_memory_budget_is_refused(settings: Settings) -> None:
    source = str(trained_job(settings))  # resnet8, trained on digits
    large = {"name": "synthetic", "image_size": 256, "split": "test"}
    evaluate = {"kind": "evaluate", "source_job": source, "dataset": large}
    with lowered(settings, max_train_memory_bytes=2 * 1024**3) as client:
        message = _refused(client.post(JOBS, json=evaluate), loc=["body", "dataset"])
        assert "evaluating resnet8 on 256x256x3 images at batch 512 needs an estimated" in message
        assert "over MAX_TRAIN_MEMORY_BYTES = 2 GiB" in message
        small = {**evaluate, "dataset": {**large, "image_size": 8}}
        assert client.post(JOBS, json=small).status_code == 202


PAPERS_LARGEST = {
    "ImageNet ResNet-152, batch 256, 600k iterations": (
        {"name": "resnet152"},
        {"name": "imagefolder", "path": "imagenet", "image_size": 224},
        {"batch_size": 256, "iterations": 600_000},
    ),
    "ImageNet ResNet-200": (
        {"name": "preact_resnet200"},
        {"name": "imagefolder", "path": "imagenet", "image_size": 224},
        {"batch_size": 256, "iterations": 600_000},
    ),
    "ResNet-1001 on CIFAR-10": ({"name": "preact_resnet1001"}, CIFAR, {"batch_size": 128}),
    "ResNet-1202 on CIFAR-10": ({"name": "resnet1202"}, CIFAR, {}),
}


@pytest.mark.parametrize(
    ("model", "dataset", "recipe"), PAPERS_LARGEST.values(), ids=list(PAPERS_LARGEST)
)
def test_the_papers_largest_runs_are_within_the_default_budgets(
    model: dict[str, Any], dataset: dict[str, Any], recipe: dict[str, Any]
) -> None:
    spec = {"kind": "train", "model": model, "dataset": dataset, "recipe": recipe}
    assert kinds.get("train").parse(spec, Settings()).model.name == model["name"]


def test_every_preset_at_the_papers_scale_is_admitted(client: TestClient) -> None:
    presets = client.get("/api/v1/studies/presets").json()
    assert presets
    # The ImageNet preset trains on an image folder: ImageNet's train/ and val/ trees.
    imagenet = {"name": "imagefolder", "path": "imagenet"}
    for preset in presets:
        dataset = CIFAR if "cifar10" in preset["quick_datasets"] else imagenet
        body = {"preset": preset["name"], "dataset": dataset, "scale": "paper", "seeds": 1}
        response = client.post("/api/v1/studies", params={"dry_run": True}, json=body)
        assert response.status_code == 200, (preset, response.text)


def test_a_study_cell_over_a_budget_is_named(client: TestClient) -> None:
    body = {
        "base": {"model": {"name": "resnet1202"}, "dataset": CIFAR},
        "grid": {"recipe.batch_size": [128, 65_536]},
    }
    response = client.post("/api/v1/studies", params={"dry_run": True}, json=body)
    message = _refused(response)
    assert message.startswith("cell 1 (recipe.batch_size=65536): training resnet1202")
    assert "MAX_TRAIN_MEMORY_BYTES" in message


def test_the_worker_checks_the_budgets_on_the_data_it_read(tmp_path: Path) -> None:
    # An ImageFolder's image size is known only once it is read: the worker checks again.
    spec = TrainJobSpec.model_validate(
        {
            "model": {"name": "resnet20"},
            "dataset": {"name": "synthetic", "image_size": 32, "train_size": 64},
            "recipe": {"batch_size": 64, "iterations": 10},
        }
    )
    data = load_dataset(spec.dataset, data_root=tmp_path)
    steps, _macs = budget(spec, data, Settings(max_train_memory_bytes=2**30))
    assert steps == 10
    # ResNet-20 keeps 1.5 MB a 32x32 image: about 100 MB at batch 64.
    with pytest.raises(InvalidError, match=re.escape("over MAX_TRAIN_MEMORY_BYTES = 0.0488 GiB")):
        budget(spec, data, Settings(max_train_memory_bytes=50 * 1024**2))


def test_a_delivered_spec_over_a_lowered_budget_fails_validation() -> None:
    # A worker validates each job's spec as it takes it, with its own budgets.
    with pytest.raises(ValidationError, match="over MAX_JOB_MACS = 1e\\+09"):
        kinds.get("train").parse(TRAIN, Settings(max_job_macs=1e9))


def _cursor(parts: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("sort", "parts", "why"),
    [
        (
            "-created",
            ["-created", 123, str(uuid.uuid4())],
            "its created_at value is not an ISO time",
        ),
        ("-created", ["-created", None, 5], "its created_at value is null"),
        ("-created", ["-created", "2026-11-30T12:00:00+00:00", 5], "its id is not a job id"),
        ("-created", ["-created", "yesterday", str(uuid.uuid4())], "not an ISO time"),
        ("best_test_error", ["best_test_error", "low", str(uuid.uuid4())], "not a number"),
        ("best_test_error", ["best_test_error", 10**400, str(uuid.uuid4())], "out of range"),
        ("-created", ["-created", 1], "not a [sort, value, id] list"),
        ("-created", {"sort": "-created"}, "not a [sort, value, id] list"),
    ],
)
def test_a_forged_list_cursor_is_a_422_saying_why(
    client: TestClient, sort: str, parts: Any, why: str
) -> None:
    response = client.get(JOBS, params={"sort": sort, "cursor": _cursor(parts)})
    message = _refused(response, loc=["query", "cursor"])
    assert why in message
    assert "pass a page's next_cursor as it came" in message


def test_a_body_that_cannot_be_parsed_is_a_422_like_any_invalid_body(client: TestClient) -> None:
    not_utf8 = b'{"kind": "train", "name": "\xef9\xc5"}'
    response = client.post(JOBS, content=not_utf8, headers={"content-type": "application/json"})
    assert "the body could not be parsed" in _refused(response, loc=["body"])
    broken_form = b"--b\r\n1131--b--\r\n"
    response = client.post(
        "/api/v1/datasets",
        content=broken_form,
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    assert response.status_code == 422, response.text


def test_huge_integers_in_paths_queries_headers_and_registry_bodies_are_422(
    client: TestClient,
) -> None:
    events = f"{JOBS}/{uuid.uuid4()}/events"
    _refused(client.get(events, params={"since_step": BIG}), loc=["query", "since_step"])
    _refused(
        client.get(events, headers={"last-event-id": str(BIG)}), loc=["header", "last-event-id"]
    )
    alias = client.put("/api/v1/registry/digits/aliases/production", json={"version": BIG})
    _refused(alias, loc=["body", "version"])
    version = client.delete(f"/api/v1/registry/digits/versions/{BIG}")
    _refused(version, loc=["path", "version"])
