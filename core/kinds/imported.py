"""The import kind: the row of weights imported from a file (`core.imports`), never queued.

An import is done within its request: its job row is made succeeded, with one checkpoint
(the converted file) that a registered version serves. The kind is registered so that such
rows list, filter and read as every other job; submitting one to `POST /jobs` is refused,
and a worker never runs one (a succeeded job is not retried either).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from sqlalchemy.orm import Session

from core.errors import InvalidError
from core.kinds.base import JobKind, RowFacts, RunContext
from core.settings import Settings
from training.specs import ModelSpec, Spec, Tag

MADE_BY = "POST /api/v1/registry/{name}/versions/import"


class ImportJobSpec(Spec):
    """Weights imported from a file (or a named torchvision weight): made by the import."""

    kind: Literal["import"]
    name: str | None = Field(None, max_length=200)
    tags: tuple[Tag, ...] = Field((), max_length=20)
    model: ModelSpec
    format: str = Field(description="torchvision, akamaster or safetensors.")
    file_name: str = Field(max_length=300)
    weights: str | None = Field(None, description="The torchvision weight enum, if one was named.")
    classes: int = Field(ge=1, description="How many classes the net answers.")


def record(
    _session: Session, _settings: Settings, _spec: ImportJobSpec
) -> tuple[ImportJobSpec, RowFacts]:
    """Refused: an import job is made by the import, with its weights."""
    raise InvalidError(
        f"an import job is made by {MADE_BY} with the weights file, not submitted",
        field=("body", "kind"),
    )


def net_of(stored: dict[str, Any]) -> tuple[ModelSpec, int]:
    """The net the import's checkpoint holds, and its classes."""
    spec = ImportJobSpec.model_validate(stored)
    return spec.model, spec.classes


def run(_spec: ImportJobSpec, context: RunContext) -> dict[str, Any]:
    """Refused: nothing is left to run (the import succeeded in its request)."""
    raise InvalidError(f"job {context.job_id} is an import: it has nothing to run")


KIND = JobKind(
    name="import",
    description=f"Weights imported from a file as a registered version ({MADE_BY}).",
    spec=ImportJobSpec,
    record=record,
    run=run,
    net=net_of,
    queued=False,
)
