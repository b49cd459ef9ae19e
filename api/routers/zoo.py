"""The model zoo: every network of both papers with its parameters and MACs."""

from __future__ import annotations

import threading
from functools import cache

from fastapi import APIRouter

import models
from api.deps import ReadKey
from api.errors import responses
from api.schemas import API_PREFIX, ModelOut

router = APIRouter(prefix=f"{API_PREFIX}/models", tags=["models"])
# Counting MACs takes about 12 s of CPU for the whole zoo (ResNet-1202 alone 2.5 s), so the
# app describes the nets in the background at start; a lock per net keeps a request
# that arrives meanwhile from counting the same net twice.
_locks: dict[str, threading.Lock] = {}


@cache
def _described(name: str) -> ModelOut:
    return ModelOut.model_validate(models.describe(name))


def describe(name: str) -> ModelOut:
    """One net of the zoo, described once per process."""
    with _locks.setdefault(name, threading.Lock()):
        return _described(name)


def warm_up(stop: threading.Event) -> None:
    """Describe every net ahead of the first request, until `stop` is set."""
    for name in models.list_models():
        if stop.is_set():
            return
        describe(name)


@router.get("", summary="The model zoo", responses=responses(401, 403))
def list_zoo(_: ReadKey) -> list[ModelOut]:
    """Every net of both papers, in the papers' order, with params and MACs per image."""
    return [describe(name) for name in models.list_models()]
