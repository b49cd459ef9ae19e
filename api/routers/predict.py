"""Prediction: classify uploaded images with a registered model or a job's best checkpoint.

A request is read, resolved, loaded (on a cache miss) and decoded in one thread-pool hop;
its good images then go to the model's micro-batcher as one submission, which the event
loop awaits without running the model.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
from fastapi import APIRouter, File, Query, Request, UploadFile
from starlette.concurrency import run_in_threadpool

from api.deps import PredictKey, ReadKey, SettingsDep
from api.errors import (
    RETRY_AFTER_S,
    ApiError,
    BadImageError,
    ConflictError,
    OverloadedError,
    TooLargeError,
    UnsupportedImageError,
    responses,
)
from api.inference import REFS, Closed, ModelCache, Overloaded, Served
from api.routers.registry import api_error
from api.schemas import (
    API_PREFIX,
    BatcherStats,
    ClassScore,
    ErrorDetail,
    ImageError,
    ImagePrediction,
    PredictOut,
    PredictStats,
    Preprocessing,
    ServedModel,
    Timing,
)
from core import registry
from core.db.session import session_scope
from core.settings import Settings
from training.checkpoints import CheckpointError
from training.inference import ImageRejectedError, fit_to, open_checked

router = APIRouter(prefix=f"{API_PREFIX}/predict", tags=["predict"])
PATH = router.prefix  # the body limit of this exact path is sized by `body_limit`
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers of a full request, generously


_FILE_ERRORS: dict[int, type[ApiError]] = {
    400: BadImageError,
    413: TooLargeError,
    415: UnsupportedImageError,
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


@router.post(
    "", summary="Classify images", responses=responses(400, 401, 403, 404, 409, 413, 415, 422, 503)
)
async def predict(
    request: Request,
    files: Annotated[list[UploadFile], File(description="One or more PNG/JPEG/WebP/BMP.")],
    settings: SettingsDep,
    _: PredictKey,
    model: Annotated[
        str,
        Query(
            min_length=1,
            max_length=200,
            description="A job id, `name` (latest version), `name/3` or `name@alias`.",
        ),
    ],
    top_k: Annotated[int, Query(ge=1, le=1000)] = 5,
) -> PredictOut:
    """The top-k classes of each file, preprocessed as the checkpoint's training was.

    Failure rule: when every file is bad, the request fails as a whole with the status of
    the first bad file (400 empty/truncated, 413 too many bytes or pixels, 415 not an
    allowed image) and a message naming each file. When at least one file is good, the
    answer is 200 with one result per file in request order; a bad file's result has no
    classes and an `error` {status, message}. More files than allowed fail the whole
    request with 413; an unknown model is 404, a model that cannot serve 409, and a full
    queue 503 with Retry-After.
    """
    started = time.perf_counter()
    if len(files) > settings.predict_max_files:
        raise TooLargeError(
            f"{len(files)} files is over the limit of {settings.predict_max_files} per request; "
            "send them in several requests"
        )
    cache: ModelCache = request.app.state.model_cache
    target, served, images = await run_in_threadpool(_prepare, settings, cache, model, files)
    good = [image.array for image in images if image.array is not None]
    if not good:
        raise _all_failed(images)
    batch = torch.from_numpy(np.stack(good))
    queued = time.perf_counter()
    try:
        future = served.batcher.submit(batch)
    except Closed:  # evicted from the cache just now: load it again
        served = await run_in_threadpool(_load, settings, cache, target)
        future = _submit(served, batch)
    except Overloaded as error:
        raise _overloaded(error) from error
    probabilities = await asyncio.wrap_future(future)
    forward_ms = (time.perf_counter() - queued) * 1000
    results = _results(images, probabilities, served, top_k)
    timing = Timing(queue_forward_ms=forward_ms, total_ms=(time.perf_counter() - started) * 1000)
    return PredictOut(
        model=_served_model(target),
        preprocessing=_preprocessing(served),
        results=results,
        timing=timing,
    )


def _submit(served: Served, batch: torch.Tensor) -> Future[torch.Tensor]:
    """The batch queued for the model's next forward pass, or 503 when its queue is full."""
    try:
        return served.batcher.submit(batch)
    except (Overloaded, Closed) as error:
        raise _overloaded(error) from error


def _overloaded(error: Exception) -> OverloadedError:
    return OverloadedError(f"{error}; retry in {RETRY_AFTER_S} s")


# A plain `def`, in the thread pool: the cache's lock is held while a model loads.
@router.get("/stats", summary="Loaded models and their batching", responses=responses(401, 403))
def stats(request: Request, _: ReadKey) -> PredictStats:
    """Model loads so far, and per loaded model the forward passes by batch size."""
    cache: ModelCache = request.app.state.model_cache
    with cache.lock:
        entries = list(cache.entries.items())
    models = []
    for sha256, served in entries:
        sizes = dict(served.batcher.batch_sizes)
        models.append(
            BatcherStats(
                sha256=sha256,
                queued=served.batcher.queue.qsize(),
                max_batch=served.batcher.max_batch,
                batches=sum(sizes.values()),
                images=sum(size * count for size, count in sizes.items()),
                batch_sizes=dict(sorted(sizes.items())),
            )
        )
    return PredictStats(loads=cache.loads, models=models)


def _prepare(
    settings: Settings, cache: ModelCache, ref: str, files: list[UploadFile]
) -> tuple[registry.Resolved, Served, list[_Image]]:
    """Resolve the reference, load its model (on a miss) and check every file (a thread)."""
    target = _resolve(settings, ref)
    served = _load(settings, cache, target)
    return target, served, [_checked(settings, served, index, f) for index, f in enumerate(files)]


def _resolve(settings: Settings, ref: str) -> registry.Resolved:
    """What `ref` points at (kept for predict_ref_ttl_ms), or its 4xx."""
    key, ttl_s = (settings.database_url, ref), settings.predict_ref_ttl_ms / 1000
    kept = REFS.get(key, ttl_s)
    if kept is not None:
        return kept
    generation = REFS.generation
    with session_scope(settings.database_url) as session:
        try:
            target = registry.resolve(session=session, ref=ref)
        except registry.RegistryError as error:
            raise api_error(error) from error
    if ttl_s > 0:
        REFS.put(key, target, generation)
    return target


def _load(settings: Settings, cache: ModelCache, target: registry.Resolved) -> Served:
    """The served model of a checkpoint inside the artifact store, after its sha256 check."""
    path = Path(target.path).resolve()
    if not path.is_relative_to(settings.artifact_dir.resolve()):
        # Only files the service wrote are ever opened, never a path from elsewhere.
        raise ConflictError(
            f"the checkpoint of {target.ref!r} lies outside the artifact store; "
            "register a checkpoint of a job of this service"
        )
    try:
        return cache.get(path, target.sha256)
    except CheckpointError as error:
        raise ConflictError(
            f"the checkpoint of {target.ref!r} cannot be served: {error}"
        ) from error


def _checked(settings: Settings, served: Served, index: int, upload: UploadFile) -> _Image:
    """One file checked, decoded and fitted to the model's input, or its error."""
    name = upload.filename or f"file {index + 1}"
    limit = settings.predict_max_image_bytes
    size = upload.size if upload.size is not None else 0
    if size > limit:  # refused without reading it
        message = f"{name}: {size:,} bytes is over the limit of {limit:,} per image"
        return _Image(name, error=ImageRejectedError(413, message))
    try:
        image = open_checked(upload.file.read(), name, max_pixels=settings.predict_max_pixels)
        array, resize = fit_to(image, served.predictor.info)
    except ImageRejectedError as error:
        return _Image(name, error=error)
    except (OSError, ValueError) as error:  # decodable header, undecodable pixel data
        return _Image(name, error=ImageRejectedError(400, f"{name}: cannot be decoded ({error})"))
    return _Image(name, array=array, resize=resize)


def _all_failed(images: list[_Image]) -> ApiError:
    """The whole request's error when no file is usable: the first bad file's status."""
    failed = [(index, image.error) for index, image in enumerate(images) if image.error]
    first = failed[0][1]
    details = [ErrorDetail(loc=["body", "files", i], msg=str(e)) for i, e in failed]
    message = "no file could be classified: " + "; ".join(str(e) for _, e in failed)
    return _FILE_ERRORS.get(first.status, BadImageError)(message, details=details)


def _results(
    images: list[_Image], probabilities: torch.Tensor, served: Served, top_k: int
) -> list[ImagePrediction]:
    """Per file in request order: its top-k classes, or its error."""
    classes = served.predictor.info.classes
    values, indices = probabilities.topk(min(top_k, len(classes)), dim=1)
    rows = iter(zip(values.tolist(), indices.tolist(), strict=True))
    results = []
    for image in images:
        if image.error is not None:
            error = ImageError(status=image.error.status, message=str(image.error))
            results.append(ImagePrediction(file=image.name, resize=None, top_k=[], error=error))
            continue
        scores, labels = next(rows)
        top = [
            ClassScore(label=classes[i], index=i, probability=p)
            for p, i in zip(scores, labels, strict=True)
        ]
        results.append(
            ImagePrediction.model_validate(
                {"file": image.name, "resize": image.resize, "top_k": top}
            )
        )
    return results


def _served_model(target: registry.Resolved) -> ServedModel:
    return ServedModel(
        ref=target.ref,
        name=target.model,
        version=target.version,
        job_id=target.job_id,
        sha256=target.sha256,
        step=target.step,
    )


def _preprocessing(served: Served) -> Preprocessing:
    info = served.predictor.info
    return Preprocessing(
        channels=info.channels,
        input_size=list(info.image_size),
        mean=list(info.mean),
        std=list(info.std),
    )
