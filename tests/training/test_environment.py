"""The environment a run records, and where it records it."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch
import torchvision

from training import checkpoints, runs
from training.environment import environment
from training.events import RecordingSink
from training.options import RunOptions
from training.specs import TrainSpec


def test_the_environment_names_the_versions_and_the_device() -> None:
    facts = environment(torch.device("cpu"))
    assert facts["torch"] == torch.__version__
    assert facts["torchvision"] == torchvision.__version__
    assert facts["python"] == platform.python_version()
    assert (facts["device_type"], facts["device_count"]) == ("cpu", 1)
    assert facts["device"]  # the CPU's model
    assert facts["service"] == "0.1.0"
    commit = facts["git_commit"]
    assert commit is None or len(commit.removesuffix("+dirty")) == 40
    json.dumps(facts)  # plain values only


def test_a_run_records_its_data_and_environment_in_summary_and_checkpoints(
    tmp_path: Path,
) -> None:
    spec = TrainSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {"name": "digits", "train_limit": 64},
            "recipe": {"batch_size": 32, "iterations": 2},
        }
    )
    summary = runs.train(
        spec, RunOptions(out_dir=tmp_path / "run", data_root=tmp_path), RecordingSink()
    )
    assert summary["environment"]["torch"] == torch.__version__
    data = summary["data"]
    assert data["digest"].startswith("sha256:")
    assert data["splits"]["train"] == 64
    assert len(data["classes"]) == 10
    saved = checkpoints.load(tmp_path / "run" / "checkpoints" / checkpoints.BEST)
    assert saved["provenance"] == data
    assert saved["environment"] == summary["environment"]
    # Another seed of the split is other data: another digest.
    other = spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"split_seed": 1})})
    again = runs.train(
        other, RunOptions(out_dir=tmp_path / "other", data_root=tmp_path), RecordingSink()
    )
    assert again["data"]["digest"] == data["digest"]  # the same files...
    assert again["data"]["splits"] == data["splits"]  # ...split otherwise, of the same sizes
