"""The Open Inference Protocol (KServe v2, as Triton serves it) at `/v2`, beside /api/v1.

A model is named as in the predict route's `model`: a registered name (its latest
version), `name@alias` (in the path as it is, or `%40`-escaped), or a job id (its best
checkpoint); `/versions/{v}` picks version v of a name. What a model takes and gives is
`serving.infer`'s; each route here parses its path, makes one call of the data plane
(`serving.dataplane`) and renders its answer.

This adapter renders the protocol's errors itself, `{"error": "message"}`, with the
statuses of `api.errors` but one: where the API answers 422 for a malformed request, the
protocol answers 400 (`render_error`, which `api.app` installs for the paths under /v2).
Infer shares the predict route's admission, micro-batcher, limits, scopes (predict to
infer, read for metadata; the same `Authorization: Bearer` key) and metrics. A model is
ready when its reference resolves and it may be served (it starts on its first request).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic_core import to_json

from api import errors
from api.errors import Refusal
from api.hot_routes import caller_of, hot, plane_of
from api.routers.health import readiness
from core.errors import InvalidError
from core.settings import Settings
from serving import infer as infer_call
from serving import protocol
from serving.dataplane import label_of
from serving.protocol import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    ProtocolErrorOut,
    ServerMetadata,
)
from serving.rollout import SESSION_HEADER, VERSION_HEADER_RAW

router = APIRouter(prefix="/v2", tags=["inference (Open Inference Protocol v2)"])
PREFIX = router.prefix

JSON_OVERHEAD = 64 * 1024  # the JSON header and the BYTES elements' lengths, generously


def body_limit(settings: Settings) -> int:
    """The infer routes' body limit: every image at its limit, plus the JSON header."""
    return settings.predict_max_files * settings.predict_max_image_bytes + JSON_OVERHEAD


def is_infer(path: str) -> bool:
    """Whether a request path is an infer route's (its body limit, its early refusal)."""
    return path.startswith(PREFIX + "/models/") and path.endswith("/infer")


def infer_ref(path: str) -> str | None:
    """The model reference of an infer path as the route resolves it (None: not one)."""
    if not is_infer(path):
        return None
    parts = path[len(PREFIX + "/models/") :].split("/")
    if len(parts) == 2:
        return parts[0]
    if len(parts) == 4 and parts[1] == "versions":
        try:
            return infer_call.model_ref(parts[0], parts[2])
        except InvalidError:
            return None
    return None


def status_of(error: BaseException) -> int:
    """The protocol's status of an error: the API's, but 400 for its 422."""
    status = errors.status_of(error)
    return 400 if status == 422 else status


def render_error(refusal: Refusal) -> Response:
    """An error in the protocol's shape, {"error": "message"}; its one status for a
    malformed request is 400 (where the API answers 422)."""
    status = 400 if refusal.status == 422 else refusal.status
    return _json({"error": refusal.message}, status, refusal.headers)


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ProtocolErrorOut} for status in statuses}


_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
_INFER_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": protocol.inline_schema(InferRequest)},
        "application/octet-stream": {
            "schema": {
                "type": "string",
                "format": "binary",
                "description": "The JSON header (Inference-Header-Content-Length bytes), then "
                "the inputs' raw bytes.",
            }
        },
    },
}


# --- server ---------------------------------------------------------------------------


@router.get("", summary="Server metadata", response_model=ServerMetadata)
async def server_metadata(request: Request) -> Response:
    """The server's name, version and the protocol extensions it speaks."""
    body = {
        "name": request.app.title,
        "version": request.app.version,
        "extensions": list(protocol.EXTENSIONS),
    }
    return _json(body)


@router.get("/health/live", summary="The server is live")
async def live() -> Response:
    """200 while the process serves requests."""
    return _json({"live": True})


@router.get("/health/ready", summary="The server is ready", responses=_errors(503))
async def ready(request: Request) -> Response:
    """200 when the database and the broker answer (as /api/v1/readyz), else 503."""
    settings: Settings = request.app.state.settings
    checks = await readiness(settings)
    if all(result == "ok" for result in checks.values()):
        return _json({"ready": True})
    failed = "; ".join(f"{name}: {result}" for name, result in checks.items() if result != "ok")
    return _json({"error": f"not ready: {failed}"}, 503)


# --- models ---------------------------------------------------------------------------


@router.get(
    "/models/{name}",
    summary="Model metadata",
    response_model=ModelMetadata,
    responses=_errors(400, 401, 403, 404, 409, 503),
    openapi_extra={"parameters": [_NAME]},
)
async def model_metadata(request: Request) -> Response:
    """A model's versions, inputs and outputs (its process is started to read them)."""
    return await _metadata(request, request.path_params["name"], None)


@router.get(
    "/models/{name}/versions/{version}",
    summary="Model version metadata",
    response_model=ModelMetadata,
    responses=_errors(400, 401, 403, 404, 409, 503),
    openapi_extra={"parameters": [_NAME, _VERSION]},
)
async def version_metadata(request: Request) -> Response:
    """Version `version` of a model: its inputs and outputs."""
    path = request.path_params
    return await _metadata(request, path["name"], path["version"])


@router.get(
    "/models/{name}/ready",
    summary="The model is ready",
    responses=_errors(400, 401, 403, 404, 409, 503),
    openapi_extra={"parameters": [_NAME]},
)
async def model_ready(request: Request) -> Response:
    """200 when the model resolves and may be served (it starts on its first request)."""
    return await _ready(request, request.path_params["name"], None)


@router.get(
    "/models/{name}/versions/{version}/ready",
    summary="The model version is ready",
    responses=_errors(400, 401, 403, 404, 409, 503),
    openapi_extra={"parameters": [_NAME, _VERSION]},
)
async def version_ready(request: Request) -> Response:
    """200 when version `version` resolves and may be served."""
    path = request.path_params
    return await _ready(request, path["name"], path["version"])


async def _metadata(request: Request, name: str, version: str | None) -> Response:
    caller = caller_of(request, "read")
    body = await plane_of(request).metadata(name, version, caller)
    return Response(body.model_dump_json(), media_type="application/json")


async def _ready(request: Request, name: str, version: str | None) -> Response:
    await plane_of(request).ready(name, version, caller_of(request, "read"))
    return _json({"ready": True})


# --- infer ----------------------------------------------------------------------------


_INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "model": InferResponse,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
    **_errors(400, 401, 403, 404, 409, 413, 415, 503),
}


@router.post(
    "/models/{name}/infer",
    summary="Classify images (infer)",
    response_model=InferResponse,
    responses=_INFER_RESPONSES,
    openapi_extra={"parameters": [_NAME], "requestBody": _INFER_BODY},
)
@hot
async def infer(request: Request) -> Response:
    """Class probabilities (or top-k classes) of a batch of images."""
    return await _infer(request, request.path_params["name"], None)


@router.post(
    "/models/{name}/versions/{version}/infer",
    summary="Classify images with a model version (infer)",
    response_model=InferResponse,
    responses=_INFER_RESPONSES,
    openapi_extra={"parameters": [_NAME, _VERSION], "requestBody": _INFER_BODY},
)
@hot
async def version_infer(request: Request) -> Response:
    """Class probabilities (or top-k classes) of a batch of images, by version `version`."""
    path = request.path_params
    return await _infer(request, path["name"], path["version"])


async def _infer(request: Request, name: str, version: str | None) -> Response:
    """The shared hot path, admitted before the body is read; the answer in the protocol's
    form."""
    caller = caller_of(request, "predict")
    ref = infer_call.model_ref(name, version)
    header_length = request.headers.get(protocol.HEADER_LENGTH)
    plane = plane_of(request)
    session_key = request.headers.get(SESSION_HEADER)
    (header, raw), served = await plane.infer(
        ref, caller, request.body, header_length, status_of=status_of, session_key=session_key
    )
    if raw is None:
        response = Response(header, media_type="application/json")
    else:
        headers = {"Inference-Header-Content-Length": str(len(header))}
        response = Response(header + raw, media_type="application/octet-stream", headers=headers)
    response.raw_headers.append((VERSION_HEADER_RAW, label_of(served).encode()))
    return response


def _json(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(to_json(body), status, headers, media_type="application/json")
