"""Prediction: classify uploaded images with a registered model or a job's best checkpoint.

Two bodies: a multipart form of one or more files, or one image as the raw body
(`Content-Type: image/png`, `image/jpeg`, `image/webp` or `image/bmp`). Either way the
route parses its query, makes one call of the data plane (`serving.dataplane`,
`DataPlane.predict`) and renders its answer: the reference is resolved and the request
admitted into its model's queue before its body is read (503 with Retry-After when no
place is free), its files' sizes and headers are checked before the model is loaded on a
cache miss (a request of bad files starts no model), then decoded and sent to the
model's micro-batcher as one submission, which the event loop awaits without running
the model.
"""

from __future__ import annotations

import time

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic_core import to_json
from starlette.datastructures import FormData, UploadFile

from api import errors
from api.deps import ReadKey
from api.errors import TooLargeError, responses
from api.hot_routes import caller_of, hot, plane_of, query_of
from api.schemas import (
    API_PREFIX,
    BatcherStats,
    PredictOut,
    PredictStats,
)
from core import model_registry
from core.errors import InvalidError
from core.settings import Settings
from serving.cache import ModelCache
from serving.dataplane import Prediction, label_of
from serving.files import FILE_ERRORS, Upload
from serving.rollout import SESSION_HEADER, VERSION_HEADER_RAW
from training.preprocess import Preprocessing

router = APIRouter(prefix="/predict", tags=["predict"])
PATH = API_PREFIX + router.prefix  # this exact path's body limit is sized by `body_limit`
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers of a full request, generously
RAW_TYPES = ("image/png", "image/jpeg", "image/webp", "image/bmp")
RAW_NAME = "image"  # the file name a raw body's result carries
QUICK_FORM_BYTES = 1024 * 1024  # a multipart body up to this size may be split in one pass
MAX_REF = 200
MAX_TOP_K = 1000


def body_limit(settings: Settings) -> int:
    """The request body limit of the predict route: every file at its limit, plus framing."""
    return settings.predict_max_files * settings.predict_max_image_bytes + MULTIPART_OVERHEAD


# The request, documented by hand: the route reads its query and body itself (see
# `predict`), without FastAPI's dependency solving and body parsing.
_BINARY = {"type": "string", "format": "binary"}
_OPENAPI = {
    "parameters": [
        {
            "name": "model",
            "in": "query",
            "required": True,
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_REF},
            "description": "A job id, `name` (latest version), `name/3` or `name@alias`.",
        },
        {
            "name": "top_k",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K, "default": 5},
        },
    ],
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
                            "items": _BINARY,
                            "description": "One or more PNG/JPEG/WebP/BMP.",
                        }
                    },
                }
            },
            **{kind: {"schema": _BINARY} for kind in RAW_TYPES},
        },
    },
}


@router.post(
    "",
    summary="Classify images",
    response_model=PredictOut,
    responses=responses(400, 401, 403, 404, 409, 413, 415, 422, 503),
    openapi_extra=_OPENAPI,
)
@hot
async def predict(request: Request) -> Response:
    """The top-k classes of each file, preprocessed as the checkpoint's training was.

    The body is a multipart form of `files`, or one image as the raw body with its
    Content-Type (`image/png`, `image/jpeg`, `image/webp`, `image/bmp`): the same answer,
    with one result (file `image`).

    Failure rule: when every file is bad, the request fails as a whole with the status of
    the first bad file (400 empty/truncated, 413 too many bytes or pixels, 415 not an
    allowed image) and a message naming each file. When at least one file is good, the
    answer is 200 with one result per file in request order; a bad file's result has no
    classes and an `error` {status, message}. More files than allowed fail the whole
    request with 413; an unknown model is 404, a model that cannot serve 409, and a full
    queue 503 with Retry-After.
    """
    # The hot path of the service: it runs on the event loop without a thread hop when the
    # model is running, its reference known and its images small, and it reads its query
    # and body and builds its JSON without FastAPI's dependencies, parsing and validation.
    caller = caller_of(request, "predict")
    model, top_k = _query(request)
    plane = plane_of(request)
    prediction = await plane.predict(
        model,
        caller,
        lambda: _FilesOf(request, plane.settings),
        status_of=errors.status_of,
        session_key=request.headers.get(SESSION_HEADER),
    )
    answer = {
        "model": _served_model(prediction.target),
        "preprocessing": _preprocessing(prediction.preprocessing),
        "results": _results(prediction, top_k),
        "timing": {
            "queue_forward_ms": prediction.queue_forward_s * 1000,
            "total_ms": (time.perf_counter() - prediction.started) * 1000,
        },
    }
    response = Response(to_json(answer), media_type="application/json")
    response.raw_headers.append((VERSION_HEADER_RAW, label_of(prediction.target).encode()))
    return response


def _query(request: Request) -> tuple[str, int]:
    """The `model` and `top_k` query parameters, or a 422 naming the one that is wrong."""
    query = query_of(request.scope["query_string"])
    model = query.get("model")
    if model is None:
        raise InvalidError("model: Field required", field=("query", "model"))
    if not 1 <= len(model) <= MAX_REF:
        raise InvalidError(
            f"model: String should have 1 to {MAX_REF} characters", field=("query", "model")
        )
    raw = query.get("top_k", "5")
    try:
        top_k = int(raw)
    except ValueError:
        message = "top_k: Input should be a valid integer, unable to parse string as an integer"
        raise InvalidError(message, field=("query", "top_k")) from None
    if not 1 <= top_k <= MAX_TOP_K:
        message = f"top_k: Input should be between 1 and {MAX_TOP_K}"
        raise InvalidError(message, field=("query", "top_k"))
    return model, top_k


class _FilesOf:
    """The body's files: a raw image, a small plain form split in one pass, or the files
    of a form the general parser reads (open until the prediction is answered).

    A class rather than an `asynccontextmanager`: that one's async generator and its
    wrapper cost more calls per request than the rest of reading a raw body.
    """

    __slots__ = ("form", "request", "settings")

    def __init__(self, request: Request, settings: Settings) -> None:
        self.request, self.settings = request, settings
        self.form: FormData | None = None

    async def __aenter__(self) -> list[Upload]:
        request, settings = self.request, self.settings
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind in RAW_TYPES:
            return [await _raw(request, settings)]
        quick = await _quick_files(request, settings)
        if quick is not None:
            return quick
        self.form = await request.form()  # a malformed body is a 400, a too large one a 413
        try:
            return _files(self.form, settings)
        except BaseException:
            await self.form.close()
            raise

    async def __aexit__(self, *_: object) -> None:
        if self.form is not None:
            await self.form.close()


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


def _files(form: FormData, settings: Settings) -> list[Upload]:
    """The uploaded `files` of the form, or 413/422 for too many or none."""
    files = [f for f in form.getlist("files") if isinstance(f, UploadFile)]
    if not files:
        raise InvalidError(
            "files: send one or more images as multipart/form-data file fields named files, "
            f"or one image as the body ({', '.join(RAW_TYPES)})",
            field=("body", "files"),
        )
    if len(files) > settings.predict_max_files:
        raise TooLargeError(
            f"{len(files)} files is over the limit of {settings.predict_max_files} per request; "
            "send them in several requests"
        )
    return [
        Upload(upload.filename or f"file {index + 1}", upload.file, upload.size or 0)
        for index, upload in enumerate(files)
    ]


async def _raw(request: Request, settings: Settings) -> Upload:
    """The raw body as one file; unread when its declared length is over the image limit."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > settings.predict_max_image_bytes:
        return Upload(RAW_NAME, b"", int(declared))
    body = await request.body()
    return Upload(RAW_NAME, body, len(body))


async def _quick_files(request: Request, settings: Settings) -> list[Upload] | None:
    """The files of a small multipart body of plain `files` parts, split in one pass; None
    for any other body, which the general form parser reads (with its limits and errors).

    Under load most requests are one small file: the general parser's callbacks and
    spooled files cost more than the image's decoding.
    """
    declared = request.headers.get("content-length", "")
    boundary = _form_boundary(request.headers.get("content-type", ""))
    if boundary is None or not declared.isdigit() or int(declared) > QUICK_FORM_BYTES:
        return None
    parts = _split_files(await request.body(), boundary)  # kept for the parser if None
    if parts is None or not 1 <= len(parts) <= settings.predict_max_files:
        return None
    return [Upload(name, data, len(data)) for name, data in parts]


def _form_boundary(content_type: str) -> bytes | None:
    """The boundary of a plain `multipart/form-data; boundary=...` type, else None."""
    kind, _, parameters = content_type.partition(";")
    name, equals, value = parameters.strip().partition("=")
    if kind.strip().lower() != "multipart/form-data" or name.strip().lower() != "boundary":
        return None
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if not equals or not 1 <= len(value) <= 70 or any(c in value for c in '";\\\r\n'):
        return None
    return value.encode("latin-1")


def _split_files(body: bytes, boundary: bytes) -> list[tuple[str, bytes]] | None:
    """The (file name, bytes) of each part of a multipart body whose every part is a file
    field `files` with plain headers; None for any other body (the general parser's)."""
    chunks = (b"\r\n" + body).split(b"\r\n--" + boundary)
    if len(chunks) < 3 or chunks[0] or chunks[-1] not in (b"--", b"--\r\n"):
        return None
    files = []
    for chunk in chunks[1:-1]:
        head, separator, data = chunk.partition(b"\r\n\r\n")
        name = _file_name(head) if separator and head.startswith(b"\r\n") else None
        if name is None:
            return None
        files.append((name, data))
    return files


def _file_name(head: bytes) -> str | None:
    """The file name of a part's headers, if they are a `files` file's and nothing else."""
    disposition = None
    for line in head[2:].split(b"\r\n"):
        key, colon, value = line.partition(b":")
        key = key.strip().lower()
        if not colon:
            return None
        if key == b"content-disposition":
            if disposition is not None:
                return None
            disposition = value.strip()
        elif key != b"content-type":
            return None
    if disposition is None or b"\\" in disposition:
        return None
    kind, *fields = (field.strip() for field in disposition.split(b";"))
    parameters: dict[bytes, bytes] = {}
    for field in fields:
        key, equals, value = field.partition(b"=")
        if len(value) >= 2 and value[:1] == value[-1:] == b'"':
            value = value[1:-1]
        if not equals or b'"' in value or key.lower() in parameters:
            return None
        parameters[key.lower()] = value
    if kind.lower() != b"form-data" or parameters.keys() != {b"name", b"filename"}:
        return None
    if parameters[b"name"] != b"files":
        return None
    try:
        return parameters[b"filename"].decode()
    except UnicodeDecodeError:
        return None


def _results(prediction: Prediction, top_k: int) -> list[dict[str, object]]:
    """Per file in request order: its top-k classes, or its error (an ImagePrediction)."""
    probabilities, classes = prediction.probabilities, prediction.info.classes
    k = min(top_k, len(classes))
    # Highest first, a tie in index order; numpy costs no dispatch here (torch's topk did).
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    pairs = zip(probabilities, order, strict=True)
    rows = ((row[top].tolist(), top.tolist()) for row, top in pairs)
    results: list[dict[str, object]] = []
    for image in prediction.files:
        if image.error is not None:
            status = errors.status_for(FILE_ERRORS[type(image.error)])
            error = {"status": status, "message": str(image.error)}
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


def _preprocessing(preprocessing: Preprocessing) -> dict[str, object]:
    """The checkpoint's declared preprocessing (a schemas.Preprocessing)."""
    return {
        "channels": preprocessing.channels,
        "input_size": list(preprocessing.crop),
        "resize": preprocessing.resize,
        "interpolation": preprocessing.interpolation,
        "mean": list(preprocessing.mean),
        "std": list(preprocessing.std),
    }
