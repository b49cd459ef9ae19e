"""The prediction hot path that every prediction route shares, each route a thin adapter.

`admit` resolves a reference (kept for a moment, one resolution per reference at a time),
checks that the caller may read what it points at and takes a place in the model's queue
before the request's body is read (503 when none is free). The route then reads its
body its own way: encoded image files (a multipart form, a raw image body, the Open
Inference Protocol's BYTES tensor), checked by `opened_all` before the model is loaded
(a request of bad files starts no model) and decoded by `fitted_all`, or a uint8 tensor
already decoded. `Call.model` loads the model (no suspension when it is running) and
`Call.forward` sends the batch to its micro-batcher; `Call.release` gives the place
back. Every step's refusal is the same `ApiError` or domain error whichever route
raised it; each route renders it in its own shape.

The per-model metrics (`api.telemetry.ModelMetrics`) are fed here, labelled by the
resolved target (`name/version` or the job id), never by the reference as sent.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
from PIL import Image
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Scope

from api.deps import check_scope
from api.edge import PRINCIPAL
from api.errors import (
    KEY_REQUIRED,
    RETRY_AFTER_S,
    STORE_UNAVAILABLE,
    ApiError,
    BadImageError,
    OverloadedError,
    ServerFaultError,
    StoreDownError,
    TooLargeError,
    UnauthorizedError,
    UnsupportedMediaError,
    domain_status,
)
from api.model_cache import ModelCache, RefCache
from api.model_process import Closed, ForwardError, Images, Overloaded, Probabilities, Replicas
from api.schemas import ErrorDetail
from api.telemetry import ModelMetrics, Telemetry
from core import artifacts, model_registry
from core.db.session import UNAVAILABLE, session_scope
from core.errors import ConflictError, DomainError
from core.keys import Principal
from core.owners import Caller
from core.settings import Settings
from core.storage import StoreUnavailableError
from training.checkpoints import CheckpointError
from training.predictor import (
    ImageRejectedError,
    ImageTooLargeError,
    UndecodableImageError,
    UnsupportedImageError,
    fit_to,
    load_checked,
    open_checked,
)
from training.preprocess import Preprocessing

FILE_ERRORS: dict[type[ImageRejectedError], type[ApiError]] = {
    UndecodableImageError: BadImageError,
    ImageTooLargeError: TooLargeError,
    UnsupportedImageError: UnsupportedMediaError,
}

# A request whose files are this small is checked and decoded on the event loop (a 32x32
# PNG takes about 35 us), which saves a thread hop; larger ones go to a worker thread.
INLINE_BYTES = 64 * 1024
INLINE_PIXELS = 256 * 256


class HotRoute(Route):
    """A prediction route as a plain Starlette route, put ahead of every other (`api.app`):
    matched with one regex, its endpoint called with the request alone, without FastAPI's
    per-request route resolution through included routers and its dependency solving.
    The FastAPI route of the same path and method documents it in the OpenAPI schema."""

    def __init__(self, path: str, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
        super().__init__(path, endpoint, methods=["POST"], include_in_schema=False)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self  # its template, for the request metrics
        return match, child_scope


def principal_of(request: Request, settings: Settings, scope: str) -> Principal | None:
    """The caller's key, checked by `api.edge.AuthFirst` before the body, if it holds
    `scope`; None with auth off. The hot routes read it here instead of solving
    dependencies."""
    if not settings.auth_enabled:
        return None
    principal: Principal | None = request.scope.get("state", {}).get(PRINCIPAL)
    if principal is None:
        raise UnauthorizedError(KEY_REQUIRED)
    check_scope(principal, scope)
    return principal


def label_of(target: model_registry.Resolved) -> str:
    """The metrics label of a resolved target: `name/version`, or the job id."""
    return f"{target.model}/{target.version}" if target.model else str(target.job_id)


@dataclass(slots=True)
class Upload:
    """An uploaded file: its name, its bytes (or a file to read them from, not read when
    its size is over the limit) and its size."""

    name: str
    data: bytes | IO[bytes]
    size: int


@dataclass(slots=True)
class Checked:
    """One uploaded file after checking: its model input, or why it has none."""

    name: str
    array: np.ndarray | None = None
    resize: str | None = None
    error: ImageRejectedError | None = None


Opened = tuple[Checked, Image.Image | None]


class Call:
    """A prediction request admitted into its model's queue, until `release`."""

    __slots__ = (
        "cache",
        "label",
        "metrics",
        "queue_forward_s",
        "released",
        "settings",
        "started",
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
            raise ServerFaultError(f"the model failed on this batch: {error}") from error
        self.queue_forward_s = time.perf_counter() - sent
        waited = max(0.0, self.queue_forward_s - forward_s)
        self.metrics.served(self.label, len(batch), waited, forward_s)
        return probabilities

    def release(self, status: int) -> None:
        """Give the queue place back; the request's latency and status go to the metrics."""
        if self.released:
            return
        self.released = True
        self.cache.release(self.target.sha256)
        self.metrics.answered(self.label, status, time.perf_counter() - self.started)


async def admit(request: Request, ref: str, principal: Principal | None) -> Call:
    """Resolve `ref` for a caller who may predict, and take a place in its model's queue.

    404/409/422 for a reference that does not resolve (or that the caller may not read),
    503 when the model's queue is full. The caller must `release` the call it gets.
    """
    started = time.perf_counter()
    settings: Settings = request.app.state.settings
    state = request.scope["state"]  # the lifespan's (api.app.Serving)
    refs: RefCache = state["refs"]
    telemetry: Telemetry = request.app.state.telemetry
    try:
        target = await refs.resolve(
            ref, settings.predict_ref_ttl_ms / 1000, lambda: resolve(settings, ref)
        )
        # Resolved once for every caller (and cached); whether this one may read it, each time.
        target.check_visible(Caller(principal, own_reads_only=settings.reads_owner_only))
    except Exception as error:
        telemetry.models.refused(status_of(error))
        raise
    cache: ModelCache = state["model_cache"]
    call = Call(settings, cache, target, telemetry.models, started)
    try:  # before the body is read: a request the model has no place for costs nothing
        cache.admit(target.sha256)
    except Overloaded as error:
        call.released = True  # it holds no place
        call.metrics.answered(call.label, 503, time.perf_counter() - started)
        raise OverloadedError(f"{error}; retry in {RETRY_AFTER_S} s") from error
    return call


def status_of(error: BaseException) -> int:
    """The HTTP status an error of the hot path is answered with (`api.errors`' handlers)."""
    if isinstance(error, ApiError):
        return error.status
    if isinstance(error, DomainError):
        return domain_status(error)
    if isinstance(error, HTTPException):  # a body over its limit, or one that is no form
        return 422 if error.status_code == 400 else error.status_code
    if isinstance(error, (StoreUnavailableError, *UNAVAILABLE)):
        return 503
    return 500


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
        path = Path(target.path)
        if artifacts.is_key(target.path):
            path = await run_in_threadpool(
                artifacts.local_file, settings, target.path, target.sha256
            )
        return await cache.get(path, target.sha256)
    except StoreUnavailableError as error:
        raise StoreDownError(
            f"{STORE_UNAVAILABLE} (model {target.ref!r} is not loaded yet)"
        ) from error
    except CheckpointError as error:
        raise ConflictError(
            f"the checkpoint of {target.ref!r} cannot be served: {error}"
        ) from error
    except Overloaded as error:  # no start slot freed in time
        raise OverloadedError(f"{error}; retry in {RETRY_AFTER_S} s") from error


# --- encoded image files ---------------------------------------------------------------


async def opened_all(settings: Settings, files: list[Upload]) -> list[Opened]:
    """Every file's size and header checked (nothing decoded yet), or its error."""
    if any(upload.size > INLINE_BYTES for upload in files):
        return await run_in_threadpool(_opened_each, settings, files)
    return _opened_each(settings, files)


def _opened_each(settings: Settings, files: list[Upload]) -> list[Opened]:
    return [opened(settings, upload) for upload in files]


def opened(settings: Settings, upload: Upload) -> Opened:
    """A file with its header checked (not yet decoded), or with its error."""
    name, limit = upload.name, settings.predict_max_image_bytes
    if upload.size > limit:  # refused without reading it
        message = f"{name}: {upload.size:,} bytes is over the limit of {limit:,} per image"
        return Checked(name, error=ImageTooLargeError(message)), None
    data = upload.data if isinstance(upload.data, bytes) else upload.data.read()
    try:
        image = open_checked(data, name, max_pixels=settings.predict_max_pixels, load=False)
    except ImageRejectedError as error:
        return Checked(name, error=error), None
    return Checked(name), image


async def fitted_all(preprocessing: Preprocessing, files: list[Opened]) -> list[Checked]:
    """Every checked file decoded and fitted to the model's input: small ones inline."""
    pixels = sum(image.width * image.height for _, image in files if image is not None)
    if pixels > INLINE_PIXELS:
        return await run_in_threadpool(_fitted_each, preprocessing, files)
    return _fitted_each(preprocessing, files)


def _fitted_each(preprocessing: Preprocessing, files: list[Opened]) -> list[Checked]:
    return [fitted(preprocessing, file, image) for file, image in files]


def fitted(preprocessing: Preprocessing, file: Checked, image: Image.Image | None) -> Checked:
    """A checked file decoded and fitted to the model's input, or its error."""
    if image is None:
        return file
    name = file.name
    try:
        array, resize = fit_to(load_checked(image, name), preprocessing)
    except ImageRejectedError as error:
        return Checked(name, error=error)
    except (OSError, ValueError) as error:  # decodable header, undecodable pixel data
        return Checked(name, error=UndecodableImageError(f"{name}: cannot be decoded ({error})"))
    return Checked(name, array=array, resize=resize)


def all_failed(files: list[Checked], where: tuple[str, ...] = ("body", "files")) -> ApiError:
    """The whole request's error when it cannot be answered for its files: the first bad
    file's status, and a message naming each bad file."""
    failed = [(index, file.error) for index, file in enumerate(files) if file.error]
    first = failed[0][1]
    details = [ErrorDetail(loc=[*where, i], msg=str(e)) for i, e in failed]
    message = "no file could be classified: " + "; ".join(str(e) for _, e in failed)
    return FILE_ERRORS[type(first)](message, details=details)


async def classify_files(
    call: Call, files: list[Upload], *, strict: bool = False
) -> tuple[Replicas, list[Checked], Probabilities]:
    """Check, load, decode and forward `files`: the model, each file's outcome in order,
    and the good files' probabilities. Every file bad is the first one's 4xx; with
    `strict`, any file bad is."""
    opened = await opened_all(call.settings, files)
    failed = any(image is None for _, image in opened)
    if failed and (strict or all(image is None for _, image in opened)):
        # Refused from their headers, before any model is started for them.
        raise all_failed([file for file, _ in opened])
    served = await call.model()  # no suspension when it is running
    checked = await fitted_all(served.preprocessing, opened)
    good = [file.array for file in checked if file.array is not None]
    if not good or (strict and len(good) < len(checked)):
        raise all_failed(checked)
    probabilities = await call.forward(served, np.stack(good))
    return served, checked, probabilities
