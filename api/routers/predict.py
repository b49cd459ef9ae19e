"""Prediction: classify uploaded images with a registered model or a job's best checkpoint.

A request's reference is resolved (kept for a moment, one resolution per reference at a
time) and the request takes a place in its model's queue before its body is read (503
with Retry-After when none is free). Its files' sizes and headers are checked before the
model is loaded on a cache miss (a request of bad files starts no model), then decoded:
on the event loop when they are small, in a worker thread otherwise. Its good images go
to the model's micro-batcher as one submission, which the event loop awaits without
running the model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from fastapi import APIRouter, Query, Request, Response
from PIL import Image
from pydantic_core import to_json
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile

from api.deps import PredictKey, ReadKey
from api.errors import (
    RETRY_AFTER_S,
    STORE_UNAVAILABLE,
    ApiError,
    BadImageError,
    OverloadedError,
    ServerFaultError,
    StoreDownError,
    TooLargeError,
    UnsupportedMediaError,
    responses,
)
from api.model_cache import ModelCache, RefCache
from api.model_process import (
    Closed,
    ForwardError,
    Overloaded,
    Probabilities,
    Replicas,
)
from api.schemas import (
    API_PREFIX,
    BatcherStats,
    ErrorDetail,
    PredictOut,
    PredictStats,
)
from core import artifacts, model_registry
from core.db.session import session_scope
from core.errors import ConflictError, InvalidError
from core.owners import Caller
from core.settings import Settings
from core.storage import StoreUnavailableError
from training.checkpoints import CheckpointError
from training.data import DatasetInfo
from training.predictor import (
    ImageRejectedError,
    ImageTooLargeError,
    UndecodableImageError,
    UnsupportedImageError,
    fit_to,
    load_checked,
    open_checked,
)

router = APIRouter(prefix="/predict", tags=["predict"])
PATH = API_PREFIX + router.prefix  # this exact path's body limit is sized by `body_limit`
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers of a full request, generously


_FILE_ERRORS: dict[type[ImageRejectedError], type[ApiError]] = {
    UndecodableImageError: BadImageError,
    ImageTooLargeError: TooLargeError,
    UnsupportedImageError: UnsupportedMediaError,
}


def body_limit(settings: Settings) -> int:
    """The request body limit of the predict route: every file at its limit, plus framing."""
    return settings.predict_max_files * settings.predict_max_image_bytes + MULTIPART_OVERHEAD


@dataclass
class _Image:
    """One uploaded file after checking: its model input, or why it has none."""

    name: str
    array: np.ndarray | None = None
    resize: str | None = None
    error: ImageRejectedError | None = None


# The request body, documented by hand: the route reads its form itself (see `predict`).
_MULTIPART = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["files"],
                    "properties": {
                        "files": {
                            "type": "array",
                            "items": {"type": "string", "format": "binary"},
                            "description": "One or more PNG/JPEG/WebP/BMP.",
                        }
                    },
                }
            }
        },
    }
}


@router.post(
    "",
    summary="Classify images",
    response_model=PredictOut,
    responses=responses(400, 401, 403, 404, 409, 413, 415, 422, 503),
    openapi_extra=_MULTIPART,
)
async def predict(
    request: Request,
    key: PredictKey,
    model: Annotated[
        str,
        Query(
            min_length=1,
            max_length=200,
            description="A job id, `name` (latest version), `name/3` or `name@alias`.",
        ),
    ],
    top_k: Annotated[int, Query(ge=1, le=1000)] = 5,
) -> Response:
    """The top-k classes of each file, preprocessed as the checkpoint's training was.

    Failure rule: when every file is bad, the request fails as a whole with the status of
    the first bad file (400 empty/truncated, 413 too many bytes or pixels, 415 not an
    allowed image) and a message naming each file. When at least one file is good, the
    answer is 200 with one result per file in request order; a bad file's result has no
    classes and an `error` {status, message}. More files than allowed fail the whole
    request with 413; an unknown model is 404, a model that cannot serve 409, and a full
    queue 503 with Retry-After.
    """
    # The hot path of the service: it runs on the event loop without a thread hop when the
    # model is running, its reference known and its images small, and it builds its JSON
    # without FastAPI's body parsing and response validation.
    started = time.perf_counter()
    settings: Settings = request.app.state.settings
    refs: RefCache = request.state.refs
    ttl_s = settings.predict_ref_ttl_ms / 1000
    target = await refs.resolve(model, ttl_s, partial(_resolve, settings, model))
    # Resolved once for every caller (and cached); whether this one may read it, each time.
    target.check_visible(Caller(key, own_reads_only=settings.reads_owner_only))
    cache: ModelCache = request.state.model_cache
    try:  # before the body is read: a request the model has no place for costs nothing
        cache.admit(target.sha256)
    except Overloaded as error:
        raise OverloadedError(f"{error}; retry in {RETRY_AFTER_S} s") from error
    try:
        answer = await _classify(request, settings, cache, target, top_k)
    finally:
        cache.release(target.sha256)
    answer["timing"]["total_ms"] = (time.perf_counter() - started) * 1000
    return Response(to_json(answer), media_type="application/json")


async def _classify(
    request: Request,
    settings: Settings,
    cache: ModelCache,
    target: model_registry.Resolved,
    top_k: int,
) -> dict[str, Any]:
    """Read and check the files, then (only if one is usable) load the model and run it."""
    async with request.form() as form:  # a malformed body is a 400, a too large one a 413
        files = _files(form, settings)
        opened = await _opened_all(settings, files)
        if all(image is None for _, image in opened):
            # Refused from their headers, before any model is started for them.
            raise _all_failed([file for file, _ in opened])
        served = await _load(settings, cache, target)  # no suspension when it is running
        images = await _fitted_all(served.info, opened)
    good = [image.array for image in images if image.array is not None]
    if not good:
        raise _all_failed(images)
    batch = np.stack(good)
    queued = time.perf_counter()
    try:
        try:
            probabilities = await served.predict(batch)
        except Closed:  # unloaded or stopped just now: start it again, once
            served = await _load(settings, cache, target)
            probabilities = await served.predict(batch)
    except (Overloaded, Closed) as error:
        raise OverloadedError(f"{error}; retry in {RETRY_AFTER_S} s") from error
    except ForwardError as error:
        raise ServerFaultError(f"the model failed on this batch: {error}") from error
    return {
        "model": _served_model(target),
        "preprocessing": _preprocessing(served.info),
        "results": _results(images, probabilities, served.info, top_k),
        "timing": {"queue_forward_ms": (time.perf_counter() - queued) * 1000},
    }


def _files(form: FormData, settings: Settings) -> list[UploadFile]:
    """The uploaded `files` of the form, or 413/422 for too many or none."""
    files = [f for f in form.getlist("files") if isinstance(f, UploadFile)]
    if not files:
        raise InvalidError(
            "files: send one or more images as multipart/form-data file fields named files",
            field=("body", "files"),
        )
    if len(files) > settings.predict_max_files:
        raise TooLargeError(
            f"{len(files)} files is over the limit of {settings.predict_max_files} per request; "
            "send them in several requests"
        )
    return files


@router.get("/stats", summary="Loaded models and their batching", responses=responses(401, 403))
async def stats(request: Request, _: ReadKey) -> PredictStats:
    """Model loads so far, and per running model the forward passes by batch size."""
    cache: ModelCache = request.state.model_cache
    models = []
    for sha256, served in cache.entries.items():
        sizes = served.batch_sizes
        models.append(
            BatcherStats(
                sha256=sha256,
                queued=served.pending,
                max_batch=cache.options.max_batch,
                batches=sum(sizes.values()),
                images=sum(size * count for size, count in sizes.items()),
                batch_sizes=dict(sorted(sizes.items())),
            )
        )
    return PredictStats(loads=cache.loads, models=models)


def _resolve(settings: Settings, ref: str) -> model_registry.Resolved:
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


async def _load(settings: Settings, cache: ModelCache, target: model_registry.Resolved) -> Replicas:
    """The model of a resolved checkpoint, started after its sha256 check on a miss (an
    object store's checkpoint fetched into the download cache first)."""
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


# A request whose files are this small is checked and decoded on the event loop (a 32x32
# PNG takes about 35 us), which saves a thread hop; larger ones go to a worker thread.
INLINE_BYTES = 64 * 1024
INLINE_PIXELS = 256 * 256

_Opened = tuple[_Image, Image.Image | None]


async def _opened_all(settings: Settings, files: list[UploadFile]) -> list[_Opened]:
    """Every file's size and header checked (nothing decoded yet), or its error."""
    if any(upload.size is None or upload.size > INLINE_BYTES for upload in files):
        return await run_in_threadpool(_opened_each, settings, files)
    return _opened_each(settings, files)


def _opened_each(settings: Settings, files: list[UploadFile]) -> list[_Opened]:
    return [_opened(settings, index, upload) for index, upload in enumerate(files)]


def _opened(settings: Settings, index: int, upload: UploadFile) -> _Opened:
    """A file with its header checked (not yet decoded), or with its error."""
    name = upload.filename or f"file {index + 1}"
    limit = settings.predict_max_image_bytes
    size = upload.size if upload.size is not None else 0
    if size > limit:  # refused without reading it
        message = f"{name}: {size:,} bytes is over the limit of {limit:,} per image"
        return _Image(name, error=ImageTooLargeError(message)), None
    data = upload.file.read()
    try:
        image = open_checked(data, name, max_pixels=settings.predict_max_pixels, load=False)
    except ImageRejectedError as error:
        return _Image(name, error=error), None
    return _Image(name), image


async def _fitted_all(info: DatasetInfo, opened: list[_Opened]) -> list[_Image]:
    """Every checked file decoded and fitted to the model's input: small ones inline."""
    pixels = sum(image.width * image.height for _, image in opened if image is not None)
    if pixels > INLINE_PIXELS:
        return await run_in_threadpool(_fitted_each, info, opened)
    return _fitted_each(info, opened)


def _fitted_each(info: DatasetInfo, opened: list[_Opened]) -> list[_Image]:
    return [_fitted(info, file, image) for file, image in opened]


def _fitted(info: DatasetInfo, file: _Image, image: Image.Image | None) -> _Image:
    """A checked file decoded and fitted to the model's input, or its error."""
    if image is None:
        return file
    name = file.name
    try:
        array, resize = fit_to(load_checked(image, name), info)
    except ImageRejectedError as error:
        return _Image(name, error=error)
    except (OSError, ValueError) as error:  # decodable header, undecodable pixel data
        return _Image(name, error=UndecodableImageError(f"{name}: cannot be decoded ({error})"))
    return _Image(name, array=array, resize=resize)


def _all_failed(images: list[_Image]) -> ApiError:
    """The whole request's error when no file is usable: the first bad file's status."""
    failed = [(index, image.error) for index, image in enumerate(images) if image.error]
    first = failed[0][1]
    details = [ErrorDetail(loc=["body", "files", i], msg=str(e)) for i, e in failed]
    message = "no file could be classified: " + "; ".join(str(e) for _, e in failed)
    return _FILE_ERRORS[type(first)](message, details=details)


def _results(
    images: list[_Image], probabilities: Probabilities, info: DatasetInfo, top_k: int
) -> list[dict[str, object]]:
    """Per file in request order: its top-k classes, or its error (an ImagePrediction)."""
    classes = info.classes
    values, indices = torch.from_numpy(probabilities).topk(min(top_k, len(classes)), dim=1)
    rows = iter(zip(values.tolist(), indices.tolist(), strict=True))
    results: list[dict[str, object]] = []
    for image in images:
        if image.error is not None:
            error = {"status": _FILE_ERRORS[type(image.error)].status, "message": str(image.error)}
            results.append({"file": image.name, "resize": None, "top_k": [], "error": error})
            continue
        scores, labels = next(rows)
        top = [
            {"label": classes[i], "index": i, "probability": p}
            for p, i in zip(scores, labels, strict=True)
        ]
        results.append({"file": image.name, "resize": image.resize, "top_k": top, "error": None})
    return results


def _served_model(target: model_registry.Resolved) -> dict[str, object]:
    """The reference as sent and what it resolved to (a ServedModel)."""
    return {
        "ref": target.ref,
        "name": target.model,
        "version": target.version,
        "job_id": target.job_id,
        "sha256": target.sha256,
        "step": target.step,
    }


def _preprocessing(info: DatasetInfo) -> dict[str, object]:
    """The checkpoint's training preprocessing (a Preprocessing)."""
    return {
        "channels": info.channels,
        "input_size": list(info.image_size),
        "mean": list(info.mean),
        "std": list(info.std),
    }
