"""The job list's filter and order, declared once: the query parameters of
`GET /api/v1/jobs` (and `/jobs.csv`), by name, with their types and bounds.

The service's own query model (`api.schemas.JobSearch`) is this class with the checks that
need the server (a registered kind, a filter or sort its language reads), `core.job_queries`
reads it, and `Client.jobs` and the command line send it: the wire contract of the list is
this one class. It lives in the client, which imports nothing of the server, so that the
client installs alone and the server imports it (a pydantic model, nothing more).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from client.wire import JobStatus

# The client's keywords that differ from their query parameter's name.
KEYWORDS = {"filters": "filter"}


class JobFilter(BaseModel):
    """The job list's filters and order (`core.job_search` has the filter language)."""

    model_config = ConfigDict(extra="forbid")

    status: list[JobStatus] = Field(default_factory=list, description="Any of these statuses.")
    kind: str | None = Field(None, max_length=32, description="A registered job kind.")
    model: str | None = Field(None, max_length=100, description="Zoo name, e.g. resnet56.")
    family: str | None = Field(None, max_length=32, description="resnet, plain, preact_resnet.")
    dataset: str | None = Field(None, max_length=100)
    tag: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list, max_length=20, description="Jobs with every one of these tags."
    )
    q: str | None = Field(None, max_length=200, description="Text in the job's name.")
    study: uuid.UUID | None = Field(None, description="The jobs of this study.")
    owner: uuid.UUID | Literal["me"] | None = Field(
        None, description="The jobs of this API key (its id), or `me`: the caller's."
    )
    filter: list[Annotated[str, Field(max_length=400)]] = Field(
        default_factory=list,
        max_length=20,
        description="`path op value`, all must hold: best_test_error<0.08, "
        "model.options.unit=full_preact, recipe.lr>=0.1, summary.best_train_error<0.05, "
        "dataset.name~cifar, created_at>=2026-11-01, data_digest=3f2a9c01 (the whole "
        "sha256:<hex> digest, or its first 8+ hex digits). Ops: = != < <= > >= ~ (contains).",
    )
    sort: str = Field(
        "-created",
        max_length=200,
        description="created, finished, a summary column, summary.<key> or a spec path "
        "(recipe.lr); - for descending. Nulls last, ties by id.",
    )

    @classmethod
    def asked(cls, keywords: Mapping[str, Any]) -> JobFilter:
        """The filter of a client's keywords (`filters` for `filter`), as given: the service
        checks them; a name that is not a filter's is a `TypeError`, as for a function."""
        named = {KEYWORDS.get(name, name): value for name, value in keywords.items()}
        unknown = sorted(set(named) - set(cls.model_fields))
        if unknown:
            raise TypeError(f"not a filter of the job list: {', '.join(unknown)}")
        return cls.model_construct(**{k: v for k, v in named.items() if v is not None})

    def params(self) -> dict[str, Any]:
        """The query parameters that are set: ids as text, the repeatable ones as lists."""
        params: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, str | uuid.UUID):
                params[name] = str(value)
            elif value:
                params[name] = list(value)
        return params
