"""A train job's stop rules in the worker: a diverged run fails naming its first non-finite
step; one its early stop ended on a plateau succeeds, saying why it ended."""

from __future__ import annotations

import re
import uuid
from typing import Any

import redis

from core import jobs
from core.db.session import session_scope
from core.kinds import TrainJobSpec
from core.settings import Settings
from tests.helpers import job
from worker import runner

SYNTHETIC = {"name": "synthetic", "image_size": 8, "train_size": 64, "test_size": 32}
RECIPE = {"batch_size": 16, "iterations": 40, "log_every": 50, "checkpoint_every": 4}


def _run(settings: Settings, dataset: dict[str, Any], recipe: dict[str, Any]) -> uuid.UUID:
    """Submit a resnet8 train job and run it to its outcome in this process."""
    spec = TrainJobSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {**SYNTHETIC, **dataset},
            "recipe": {**RECIPE, **recipe},
        }
    )
    with session_scope(settings.database_url) as session:
        job_id = jobs.create(session=session, settings=settings, spec=spec, max_attempts=3).id
    runner.execute(job_id, settings=settings, worker="w")
    return job_id


def test_a_diverged_job_fails_naming_the_step(settings: Settings, queue: redis.Redis) -> None:
    recipe = {"lr": 10, "warmup": "off", "mixed_precision": "fp16", "iterations": 400}
    row = job(settings.database_url, _run(settings, {"validation": 0}, recipe))
    assert row.status == "failed"
    assert row.error is not None
    assert re.fullmatch(
        r"TrainingDivergedError: the (training loss was nan|training loss was inf|weights were "
        r"not finite after) (at )?step \d+ \(lr 10\.0\); lower recipe\.lr or use warm-up "
        r"\(recipe\.warmup linear\)",
        row.error,
    ), row.error
    assert row.step is not None
    assert row.step < 400


def test_a_plateau_job_succeeds_saying_why_it_ended(settings: Settings, queue: redis.Redis) -> None:
    stop = {"metric": "val/error", "patience": 2, "min_delta": 1.0}
    recipe = {"eval_every": 4, "early_stop": stop}
    row = job(settings.database_url, _run(settings, {"validation": 0.25}, recipe))
    assert (row.status, row.error) == ("succeeded", None)
    assert row.summary is not None
    ended = row.summary["ended"]
    assert (ended["reason"], ended["step"], row.summary["stopped"]) == ("plateau", 12, False)
    assert ended["message"].startswith("val/error did not improve by more than 1.0 in 2 ")
