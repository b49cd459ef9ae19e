"""What a job kind is: its spec, what its row records, and what a worker runs for it.

A kind is one `JobKind` registered under its name. The API validates submissions against
the registered specs (a union discriminated by `kind`), with the budgets of the settings it
passes in the validation context (`validation_context`), asks the kind whether the caller
may read what the job reads (`check`), `core.jobs.create` asks the kind what to record on
the job's row, and the worker runs the kind's `run` with a `RunContext`. What the rest of
the service asks of a job's kind (may it be registered, does it train) is a property the
kind declares, never its name.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, Self, TypeVar

import torch
from pydantic import ValidationInfo
from sqlalchemy.orm import Session

from core.owners import Caller
from core.settings import Settings
from training.data import LoadedDataset
from training.events import EventSink
from training.specs import ModelSpec, TrainSpec


class KindSpec(Protocol):
    """What every job spec has: its kind's name, a name and tags, and a JSON form."""

    @property
    def kind(self) -> str: ...

    @property
    def name(self) -> str | None: ...

    @property
    def tags(self) -> tuple[str, ...]: ...

    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...

    @classmethod
    def model_validate(cls, obj: Any, *, context: Any | None = ...) -> Self: ...


S = TypeVar("S", bound=KindSpec)


@dataclass(frozen=True)
class RowFacts:
    """What a job's row records beside its spec, for listing and filtering."""

    dataset_name: str
    model_name: str | None
    model_family: str | None
    depth: int | None
    source_job_id: uuid.UUID | None = None


@dataclass(frozen=True)
class RunContext:
    """What a worker hands a running job: where it runs and how it reports."""

    job_id: uuid.UUID
    settings: Settings
    device: torch.device
    sink: EventSink
    # Steps and multiply-accumulates per step, once known: the worker's time limits.
    set_budget: Callable[[int, float], None]
    # The dataset the run read, once loaded: the worker records its provenance (digest,
    # classes, splits) and the environment on the job's row, while the job runs.
    set_data: Callable[[LoadedDataset], None] = lambda data: None


@dataclass(frozen=True)
class JobKind(Generic[S]):
    """One kind of job: its spec type, its row facts, and its run (returning the summary).

    A summary with `"stopped": true` means the run stopped early (a cancel or a time limit).
    `record` returns the spec to store, with what it names at submission pinned in it (a
    predict job's checkpoint), and the row's facts; the spec it is given stays as it was.
    """

    name: str
    description: str
    spec: type[S]
    record: Callable[[Session, Settings, S], tuple[S, RowFacts]]
    run: Callable[[S, RunContext], dict[str, Any]]
    # The net a succeeded job's checkpoints hold, from its stored spec: its zoo spec and the
    # classes it answers (what a prediction with it costs). None: they hold no net to serve.
    net: Callable[[dict[str, Any]], tuple[ModelSpec, int]] | None = None
    # The training run of its stored spec, for a kind whose run trains a net: it writes
    # checkpoints as it goes (a job id names its best one), and a fine-tune pins the
    # checkpoint it starts from at `init.resolved`. None: its run trains nothing.
    trains: Callable[[dict[str, Any]], TrainSpec] | None = None
    # False: its job is made whole in its request (an import), never queued nor run; its
    # summary says what made it.
    queued: bool = True
    # On submission: `InvalidError` unless the caller may read all the job reads (its
    # dataset's uploads, the model or job it starts from).
    check: Callable[[Session, Settings, S, Caller], None] = lambda *_: None
    # Where its stored spec or summary holds a server's file path (a pinned checkpoint's):
    # the worker reads it there, clients never see it (`shown`).
    server_paths: tuple[tuple[str, ...], ...] = ()

    @property
    def registrable(self) -> bool:
        """Whether a succeeded job's checkpoint may become a registered model's version."""
        return self.net is not None

    def parse(self, payload: Any, settings: Settings) -> S:
        """`payload` as this kind's spec, within the budgets of `settings`; pydantic's
        `ValidationError` when it is none."""
        return self.spec.model_validate(payload, context=validation_context(settings))

    def shown(self, document: str, value: Any, at: tuple[str, ...] = ()) -> Any:
        """The part `at` of a job's `document` ("spec" or "summary"), `value`, as clients
        read it: without the server paths that lie in it (a copy when it holds any)."""
        for place in self.server_paths:
            if place[0] != document or place[1 : len(at) + 1] != at:
                continue
            if len(place) == len(at) + 1:
                return None  # `at` is a server path itself
            value = _without(value, place[len(at) + 1 :])
        return value


def _without(value: Any, path: tuple[str, ...]) -> Any:
    """`value` less the key at `path` (a copy of what lies on the way; as is if absent)."""
    if not isinstance(value, dict) or path[0] not in value:
        return value
    if len(path) == 1:
        return {key: item for key, item in value.items() if key != path[0]}
    return {**value, path[0]: _without(value[path[0]], path[1:])}


_SETTINGS = "settings"


def validation_context(settings: Settings) -> dict[str, Settings]:
    """The pydantic validation context that checks a job spec against `settings`' budgets."""
    return {_SETTINGS: settings}


def settings_of(info: ValidationInfo) -> Settings | None:
    """The settings a spec is validated with (`validation_context`); None when it is
    validated without (a spec built in code: its budgets are checked where it is parsed)."""
    context = info.context
    found = context.get(_SETTINGS) if isinstance(context, dict) else None
    return found if isinstance(found, Settings) else None


KINDS: dict[str, JobKind[Any]] = {}


def trains(name: str) -> bool:
    """Whether the kind registered as `name` trains a net (its run writes checkpoints)."""
    kind = KINDS.get(name)
    return kind is not None and kind.trains is not None


def training_of(name: str, stored: dict[str, Any]) -> TrainSpec | None:
    """The training run of a stored spec of the kind `name`; None when it trains nothing."""
    kind = KINDS.get(name)
    return None if kind is None or kind.trains is None else kind.trains(stored)


def registrable(name: str) -> bool:
    """Whether a job of the kind registered as `name` may become a registered version."""
    kind = KINDS.get(name)
    return kind is not None and kind.registrable


def register(kind: JobKind[S]) -> JobKind[S]:
    """Add a kind; its name must be new."""
    if kind.name in KINDS:
        raise ValueError(f"job kind {kind.name!r} is registered already")
    KINDS[kind.name] = kind
    return kind
