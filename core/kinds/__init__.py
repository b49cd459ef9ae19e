"""Job kinds: each is one registered `JobKind` (spec, row facts, run); see `base`.

Adding a kind is one module here defining its `KIND`, and one entry in the registration
below (whose order is the order the API lists them in). `JobSpec` is the union of the
registered specs, discriminated by `kind`, that `POST /api/v1/jobs` accepts; `parse` reads
one with the budgets of the settings it is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field, TypeAdapter
from sqlalchemy.orm import Session

from core.errors import InvalidError
from core.kinds import evaluate, imported, predict, train
from core.kinds.base import (
    KINDS,
    JobKind,
    KindSpec,
    RowFacts,
    RunContext,
    register,
    training_of,
    validation_context,
)
from core.kinds.evaluate import EvaluateJobSpec
from core.kinds.imported import ImportJobSpec
from core.kinds.predict import PredictJobSpec
from core.kinds.train import TrainJobSpec
from core.owners import Caller
from core.settings import Settings

__all__ = [
    "KINDS",
    "EvaluateJobSpec",
    "ImportJobSpec",
    "JobKind",
    "JobSpec",
    "KindSpec",
    "PredictJobSpec",
    "RowFacts",
    "RunContext",
    "TrainJobSpec",
    "check_access",
    "evaluate",
    "get",
    "imported",
    "parse",
    "predict",
    "shown",
    "train",
    "training_of",
]

register(train.KIND)
register(evaluate.KIND)
register(predict.KIND)
register(imported.KIND)


def get(name: str) -> JobKind[Any]:
    """The kind called `name`, or `InvalidError` naming the kinds there are."""
    try:
        return KINDS[name]
    except KeyError:
        known = ", ".join(KINDS)
        raise InvalidError(f"job kind {name!r} is unknown; kinds are {known}") from None


def check_access(session: Session, settings: Settings, spec: KindSpec, caller: Caller) -> None:
    """On submission: `InvalidError` unless the caller may read all the job reads."""
    get(spec.kind).check(session, settings, spec, caller)


def shown(kind: str, document: str, value: Any, at: tuple[str, ...] = ()) -> Any:
    """The part `at` of a job's spec or summary as clients read it: without server paths
    (an unknown kind's as stored)."""
    found = KINDS.get(kind)
    return value if found is None else found.shown(document, value, at)


if TYPE_CHECKING:
    JobSpec = KindSpec
else:
    JobSpec = Annotated[
        Union[tuple(kind.spec for kind in KINDS.values())],  # noqa: UP007 (built at run time)
        Field(discriminator="kind"),
    ]

_JOB_SPEC: TypeAdapter[JobSpec] = TypeAdapter(JobSpec)


def parse(payload: Any, settings: Settings) -> KindSpec:
    """`payload` as the spec of the kind it names, within the budgets of `settings`;
    pydantic's `ValidationError` when it is none."""
    return _JOB_SPEC.validate_python(payload, context=validation_context(settings))
