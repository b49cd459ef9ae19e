"""A train job that needs two GPUs runs as two ranks of one DistributedDataParallel run."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import torch

from core import artifacts
from core.kinds.base import RunContext
from core.kinds.train import KIND, TrainJobSpec, processes
from core.settings import Settings
from tests.helpers import recipe
from training import checkpoints
from training.events import RecordingSink


def _spec(gpus: int) -> TrainJobSpec:
    return TrainJobSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {"name": "digits", "validation": 0, "train_limit": 256},
            "recipe": {**recipe(1), "iterations": 4, "epochs": None},
            "resources": {"device": "gpu", "gpus": gpus},
        }
    )


def test_a_job_trains_on_one_process_per_gpu_it_needs() -> None:
    assert processes(_spec(gpus=1)) == 1
    assert processes(_spec(gpus=4)) == 4
    cpu = TrainJobSpec.model_validate({**_spec(1).model_dump(), "resources": {"device": "cpu"}})
    assert processes(cpu) == 1


def test_a_two_gpu_job_on_a_cpu_worker_trains_on_two_gloo_ranks(tmp_path: Path) -> None:
    settings = Settings(artifact_dir=tmp_path / "artifacts", data_dir=tmp_path / "data")
    budgets: list[tuple[int, float]] = []
    context = RunContext(
        uuid.uuid4(),
        settings,
        torch.device("cpu"),
        RecordingSink(),
        lambda steps, macs: budgets.append((steps, macs)),
    )
    summary = KIND.run(_spec(gpus=2), context)

    assert summary["distributed"]["world_size"] == 2
    assert summary["distributed"]["backend"] == "gloo"
    assert summary["distributed"]["per_rank_batch"] == 32
    assert budgets == [(4, budgets[0][1])]  # rank 0 alone set the job's time limits
    job_dir = artifacts.job_dir(settings, context.job_id)
    assert (
        checkpoints.latest(job_dir / checkpoints.DIRECTORY) == job_dir / "checkpoints" / "step-4.pt"
    )
    assert json.loads((job_dir / "summary.json").read_text())["steps"] == 4
