"""Job specs: what `POST /api/v1/jobs` accepts. Train jobs reuse the engine's spec."""

from __future__ import annotations

import uuid
from typing import Annotated, Literal

from pydantic import Field

from training.specs import DatasetSpec, Spec, TrainSpec


class TrainJobSpec(TrainSpec):
    """Train a model: {"kind": "train", "model": {...}, "dataset": {...}, "recipe": {...}}."""


class EvaluateJobSpec(Spec):
    """Evaluate a checkpoint of a finished train job on a dataset split."""

    kind: Literal["evaluate"]
    name: str | None = Field(None, max_length=200)
    tags: tuple[str, ...] = Field((), max_length=20)
    source_job: uuid.UUID = Field(description="The train job whose checkpoint is evaluated.")
    checkpoint: Literal["best", "last"] | int = Field(
        "best", description="best, last, or a step number."
    )
    dataset: DatasetSpec
    tta: bool = Field(False, description="Average with the horizontally flipped view.")


JobSpec = Annotated[TrainJobSpec | EvaluateJobSpec, Field(discriminator="kind")]
