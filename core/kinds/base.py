"""What a job kind is: its spec, what its row records, and what a worker runs for it.

A kind is one `JobKind` registered under its name. The API validates submissions against
the registered specs (a union discriminated by `kind`), `core.jobs.create` asks the kind
what to record on the job's row, and the worker runs the kind's `run` with a `RunContext`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch
from sqlalchemy.orm import Session

from core.owners import Caller
from core.settings import Settings
from training.data import LoadedDataset
from training.events import EventSink
from training.specs import ModelSpec


class KindSpec(Protocol):
    """What every job spec has: its kind's name, a name and tags, and a JSON form."""

    @property
    def kind(self) -> str: ...

    @property
    def name(self) -> str | None: ...

    @property
    def tags(self) -> tuple[str, ...]: ...

    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


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
    `record` may pin in the spec what it names at submission (a predict job's checkpoint):
    the stored spec keeps it.
    """

    name: str
    description: str
    spec: type[S]
    record: Callable[[Session, S], RowFacts]
    run: Callable[[S, RunContext], dict[str, Any]]
    # The net a succeeded job's checkpoints hold, from its stored spec: its zoo spec and the
    # classes it answers (what a prediction with it costs). None: they hold no net to serve.
    net: Callable[[dict[str, Any]], tuple[ModelSpec, int]] | None = None
    # On submission: `InvalidError` unless the caller may read all the job reads (its
    # dataset's uploads, the model or job it starts from).
    check: Callable[[Session, Settings, S, Caller], None] = lambda *_: None


KINDS: dict[str, JobKind[Any]] = {}


def register(kind: JobKind[S]) -> JobKind[S]:
    """Add a kind; its name must be new."""
    if kind.name in KINDS:
        raise ValueError(f"job kind {kind.name!r} is registered already")
    KINDS[kind.name] = kind
    return kind
