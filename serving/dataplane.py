"""The data plane: one HTTP-free call per request kind, every protocol's adapter calls once.

`DataPlane.predict` classifies encoded image files, `DataPlane.infer` answers an Open
Inference Protocol infer body, `DataPlane.metadata` and `DataPlane.ready` describe a model.
Each resolves the reference (kept for a moment, one resolution per reference at a time)
and checks that the caller may read what it points at, in `DataPlane.target`; a
prediction then takes a place in the model's queue before its body is read (refused with
`OverloadedError` when none is free, the same test the early shed makes,
`overloaded`), reads its body through the adapter's reader, loads the model (no
suspension when it is running) and sends the batch to the model's micro-batcher.

A weighted alias (`core.model_registry.Rollout`, resolved and kept with the reference) has
one of its versions chosen per request on admission (`serving.rollout.choose`); every
answer, metric and tap sees the version that served.

Every batch a model answers is told to the plane's taps (`Served`, synchronously on the
event loop, after the answer is in hand): what watches traffic (shadow versions, payload
logs, drift) hangs off that one point and never on the request's path, so a tap must only
note or queue its work.

Every refusal is a `serving.errors` class or a domain error (`core.errors`), whichever
protocol asked; each adapter renders it in its own shape. The per-model metrics
(`serving.metrics.ModelMetrics`) are fed here, labelled by the resolved target
(`name/version` or the job id), never by the reference as sent, with the status each
adapter's `status_of` gives a refusal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from core import artifacts, model_registry
from core.db.session import session_scope
from core.db.tables import ModelVersion
from core.errors import ConflictError
from core.owners import Caller
from core.settings import Settings
from core.storage import StoreUnavailableError
from serving import infer
from serving.cache import ModelCache, RefCache
from serving.errors import (
    RETRY_AFTER_S,
    STORE_UNAVAILABLE,
    ModelFailedError,
    OverloadedError,
    UnavailableError,
)
from serving.files import Checked, Upload, all_failed, fitted_all, opened_all
from serving.metrics import ModelMetrics
from serving.process import Closed, ForwardError, Images, Overloaded, Probabilities, Replicas
from serving.protocol import ModelMetadata
from serving.rollout import choose as rollout_choice
from training.checkpoints import CheckpointError
from training.data import DatasetInfo
from training.preprocess import Preprocessing

log = logging.getLogger(__name__)
_T = TypeVar("_T")
StatusOf = Callable[[BaseException], int]  # the status a protocol answers a refusal with
Files = Callable[[], AbstractAsyncContextManager[list[Upload]]]  # a request's files, read
PLATFORM = "pytorch"


@dataclass(slots=True)
class Prediction:
    """A prediction's answer: what the reference resolved to, the model's classes and
    preprocessing, each file's outcome in order and the good files' probabilities."""

    target: model_registry.Resolved
    info: DatasetInfo
    preprocessing: Preprocessing
    files: list[Checked]
    probabilities: Probabilities
    queue_forward_s: float
    started: float  # when it was admitted (`time.perf_counter`)


@dataclass(frozen=True, slots=True)
class Served:
    """A batch a model answered, as the taps see it: the target that served it, who asked,
    the images as the model took them (uint8, N x C x H x W), their probabilities and the
    seconds from the batch's submission to its answer."""

    target: model_registry.Resolved
    caller: Caller
    images: Images
    probabilities: Probabilities
    latency_s: float


Tap = Callable[[Served], None]  # called on the event loop: note or queue, never wait


@dataclass(slots=True)
class DataPlane:
    """A server's serving runtime: its settings, model cache, resolved references,
    metrics and taps."""

    settings: Settings
    models: ModelCache
    refs: RefCache
    metrics: ModelMetrics
    taps: list[Tap] = field(default_factory=list)

    async def target(self, ref: str, caller: Caller) -> model_registry.Resolved:
        """What `ref` points at, if `caller` may read it; else the domain's 404/403/409/422."""
        settings = self.settings
        target = await self.refs.resolve(
            ref, settings.predict_ref_ttl_ms / 1000, lambda: resolve(settings, ref)
        )
        # Resolved once for every caller (and cached); whether this one may read it, each time.
        target.check_visible(caller)
        return target

    async def predict(
        self,
        ref: str,
        caller: Caller,
        files: Files,
        *,
        status_of: StatusOf,
        session_key: str | None = None,
    ) -> Prediction:
        """Classify a request's files (read by `files` once admitted): every file bad is
        the first one's refusal; otherwise each file's outcome. `session_key` keeps a
        caller without an API key on its version of a sticky alias."""

        async def classify(call: Call) -> Prediction:
            async with files() as uploads:
                served, checked, probabilities = await call.classify(uploads)
            return Prediction(
                call.target,
                served.info,
                served.preprocessing,
                checked,
                probabilities,
                call.queue_forward_s,
                call.started,
            )

        return await self._admitted(ref, caller, status_of, classify, session_key)

    async def infer(
        self,
        ref: str,
        caller: Caller,
        body: Callable[[], Awaitable[bytes]],
        header_length: str | None,
        *,
        status_of: StatusOf,
        session_key: str | None = None,
    ) -> tuple[infer.Answer, model_registry.Resolved]:
        """The Open Inference Protocol's answer to an infer body (read by `body` once
        admitted): its JSON header and the raw bytes of a binary output; and the version
        that served it (a weighted alias's choice)."""

        async def answer(call: Call) -> tuple[infer.Answer, model_registry.Resolved]:
            return await infer.answer(call, await body(), header_length), call.target

        return await self._admitted(ref, caller, status_of, answer, session_key)

    async def model_of(self, target: model_registry.Resolved) -> Replicas:
        """The running model of a resolved version (started on a miss), as a request's."""
        return await load(self.settings, self.models, target)

    async def ready(self, name: str, version: str | None, caller: Caller) -> None:
        """Return when the model resolves and may be served (it starts on its first request)."""
        await self.target(infer.model_ref(name, version), caller)

    async def metadata(self, name: str, version: str | None, caller: Caller) -> ModelMetadata:
        """A model's versions, inputs and outputs (its process is started to read them)."""
        target = await self.target(infer.model_ref(name, version), caller)
        served = await load(self.settings, self.models, target)
        versions = [str(target.version)] if version is not None or target.model is None else []
        if not versions:
            versions = await run_in_threadpool(_versions, self.settings, target)
        info = served.info
        height, width = info.image_size
        return ModelMetadata.model_validate(
            {
                "name": name,
                "versions": versions,
                "platform": PLATFORM,
                "inputs": [
                    {
                        "name": infer.INPUT,
                        "datatype": "UINT8",
                        "shape": [-1, height, width, info.channels],
                    },
                    {"name": infer.IMAGE_BYTES, "datatype": "BYTES", "shape": [-1]},
                ],
                "outputs": [
                    {
                        "name": infer.PROBABILITIES,
                        "datatype": "FP32",
                        "shape": [-1, info.num_classes],
                    }
                ],
            }
        )

    async def _admitted(
        self,
        ref: str,
        caller: Caller,
        status_of: StatusOf,
        work: Callable[[Call], Awaitable[_T]],
        session_key: str | None = None,
    ) -> _T:
        """`work(call)` for a request admitted into its model's queue; the place is given
        back after, and the answer's status and latency go to the metrics."""
        call = await self._admit(ref, caller, status_of, session_key)
        status = 500
        try:
            done = await work(call)
            status = 200
        except Exception as error:
            status = status_of(error)
            raise
        finally:
            call.release(status)
        return done

    async def _admit(
        self, ref: str, caller: Caller, status_of: StatusOf, session_key: str | None
    ) -> Call:
        started = time.perf_counter()
        try:
            target = await self.target(ref, caller)
        except Exception as error:
            self.metrics.refused(status_of(error))
            raise
        rollout = target.rollout
        if rollout is not None:  # a weighted alias: one of its versions serves this request
            target = rollout_choice(target, caller, session_key)
        call = Call(self.settings, self.models, target, self.metrics, started)
        if rollout is not None:
            call.arm = (target.model or "", rollout.alias, str(target.version))
        call.caller, call.taps = caller, self.taps
        # Before the body is read: a request the model has no place for costs nothing.
        refused = overloaded(self.models, target)
        if refused is not None:
            call.released = True  # it holds no place
            call.metrics.answered(call.label, status_of(refused), time.perf_counter() - started)
            raise refused
        self.models.admit(target.sha256)
        return call


def overloaded(cache: ModelCache, target: model_registry.Resolved) -> OverloadedError | None:
    """The refusal of a request for `target` when its model's queue is full, else None: the
    test the routes and the early shed (`api.limits.PredictShed`) both make."""
    if not cache.full(target.sha256):
        return None
    return OverloadedError(f"{cache.full_message}; retry in {RETRY_AFTER_S} s")


def label_of(target: model_registry.Resolved) -> str:
    """The metrics label of a resolved target: `name/version`, or the job id."""
    return f"{target.model}/{target.version}" if target.model else str(target.job_id)


class Call:
    """A prediction request admitted into its model's queue, until `release`."""

    __slots__ = (
        "arm",
        "cache",
        "caller",
        "label",
        "metrics",
        "queue_forward_s",
        "released",
        "settings",
        "started",
        "taps",
        "target",
    )

    def __init__(
        self,
        settings: Settings,
        cache: ModelCache,
        target: model_registry.Resolved,
        metrics: ModelMetrics,
        started: float,
    ) -> None:
        self.settings, self.cache, self.target = settings, cache, target
        self.metrics, self.started = metrics, started
        self.label = label_of(target)
        self.released = False
        self.queue_forward_s = 0.0  # from the batch's submission to its probabilities
        self.caller: Caller | None = None
        self.taps: list[Tap] = []
        self.arm: tuple[str, str, str] | None = None  # (model, alias, version) of a rollout

    async def model(self) -> Replicas:
        """The model of the target, started after its sha256 check on a miss (an object
        store's checkpoint fetched into the download cache first)."""
        return await load(self.settings, self.cache, self.target)

    async def forward(self, served: Replicas, batch: Images) -> Probabilities:
        """The batch's probabilities from the model's micro-batcher (restarted once if it
        stopped just now); the queue and forward times go to the metrics."""
        sent = time.perf_counter()
        try:
            try:
                probabilities, forward_s = await served.predict_timed(batch, self.label)
            except Closed:  # unloaded or stopped just now: start it again, once
                served = await self.model()
                sent = time.perf_counter()
                probabilities, forward_s = await served.predict_timed(batch, self.label)
        except (Overloaded, Closed) as error:
            raise OverloadedError(f"{error}; retry in {RETRY_AFTER_S} s") from error
        except ForwardError as error:
            raise ModelFailedError(f"the model failed on this batch: {error}") from error
        self.queue_forward_s = time.perf_counter() - sent
        waited = max(0.0, self.queue_forward_s - forward_s)
        self.metrics.served(self.label, len(batch), waited, forward_s)
        if self.taps and self.caller is not None:
            served_batch = Served(
                self.target, self.caller, batch, probabilities, self.queue_forward_s
            )
            for tap in self.taps:
                try:
                    tap(served_batch)
                except Exception:  # what watches traffic never fails the answer
                    log.exception("a serving tap failed on a batch of %s", self.label)
        return probabilities

    async def classify(
        self, files: list[Upload], *, strict: bool = False
    ) -> tuple[Replicas, list[Checked], Probabilities]:
        """Check, load, decode and forward `files`: the model, each file's outcome in order,
        and the good files' probabilities. Every file bad is the first one's refusal; with
        `strict`, any file bad is."""
        opened = await opened_all(self.settings, files)
        failed = any(image is None for _, image in opened)
        if failed and (strict or all(image is None for _, image in opened)):
            # Refused from their headers, before any model is started for them.
            raise all_failed([file for file, _ in opened])
        served = await self.model()  # no suspension when it is running
        checked = await fitted_all(served.preprocessing, opened)
        good = [file.array for file in checked if file.array is not None]
        if not good or (strict and len(good) < len(checked)):
            raise all_failed(checked)
        probabilities = await self.forward(served, np.stack(good))
        return served, checked, probabilities

    def release(self, status: int) -> None:
        """Give the queue place back; the request's latency and status go to the metrics."""
        if self.released:
            return
        self.released = True
        self.cache.release(self.target.sha256)
        self.metrics.answered(self.label, status, time.perf_counter() - self.started)
        if self.arm is not None:
            self.metrics.rolled_out(self.arm, status)


def resolve(settings: Settings, ref: str) -> model_registry.Resolved:
    """What `ref` points at, if its checkpoint lies in the artifact store; else its 4xx."""
    with session_scope(settings.database_url) as session:
        target = model_registry.resolve(session=session, ref=ref)
    if not artifacts.is_stored(settings, target.path):
        # Only files the service wrote are ever opened, never a path from elsewhere.
        raise ConflictError(
            f"the checkpoint of {target.ref!r} lies outside the artifact store; "
            "register a checkpoint of a job of this service"
        )
    return target


async def load(settings: Settings, cache: ModelCache, target: model_registry.Resolved) -> Replicas:
    """The model of a resolved checkpoint, started after its sha256 check on a miss."""
    served = cache.peek(target.sha256)
    if served is not None:  # a running model serves on while the store is down
        return served
    try:
        return await started(settings, target, cache.get, "served")
    except Overloaded as error:  # no start slot freed in time
        raise OverloadedError(f"{error}; retry in {RETRY_AFTER_S} s") from error


async def started(
    settings: Settings,
    target: model_registry.Resolved,
    start: Callable[[Path, str], Awaitable[_T]],
    use: str,
) -> _T:
    """`start(path, sha256)` on the target's checkpoint file, checked against its sha256;
    an unreachable store is a 503, a checkpoint that cannot be `use`d (served, explained)
    a 409."""
    try:
        # The store's own file, or its object fetched into the download cache (a miss only).
        path = await run_in_threadpool(artifacts.local_file, settings, target.path, target.sha256)
        return await start(path, target.sha256)
    except StoreUnavailableError as error:
        raise UnavailableError(
            f"{STORE_UNAVAILABLE} (model {target.ref!r} is not loaded yet)"
        ) from error
    except CheckpointError as error:
        raise ConflictError(f"the checkpoint of {target.ref!r} cannot be {use}: {error}") from error


def _versions(settings: Settings, target: model_registry.Resolved) -> list[str]:
    """The registered versions of the target's model, oldest first."""
    assert target.model is not None
    with session_scope(settings.database_url) as session:
        model = model_registry.get_model(session=session, name=target.model)
        numbers = session.scalars(
            select(ModelVersion.version)
            .where(ModelVersion.model_id == model.id)
            .order_by(ModelVersion.version)
        )
        return [str(number) for number in numbers]
