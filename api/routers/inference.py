"""The Open Inference Protocol (KServe v2, as Triton serves it) at `/v2`, beside /api/v1.

A model is named as in the predict route's `model`: a registered name (its latest
version), `name@alias` (in the path as it is, or `%40`-escaped), or a job id (its best
checkpoint); `/versions/{v}` picks version v of a name. It takes one input, either
`INPUT`, a UINT8 tensor [N, H, W, C] already at the model's input size (normalised in
the model's process as a decoded file is), or `IMAGE_BYTES`, a BYTES tensor [N] of
encoded image files (checked and decoded exactly as a multipart file: same formats,
limits and statuses). It gives `PROBABILITIES`, FP32 [N, classes], or with
`parameters.classification: k` on the output, BYTES [N, k] "score:index:label" strings.
Inputs and outputs may be JSON or raw bytes after the JSON header (the binary tensor
data extension).

Infer is the predict route's hot path (`api.serving`): the same admission, micro-batcher,
limits, scopes (predict to infer, read for metadata; the same `Authorization: Bearer`
key) and statuses, errors in the protocol's shape `{"error": "message"}` (where the
API answers 422 for a malformed request, the protocol answers 400). Unlike a multipart
request, one bad image fails the whole request, with its status. A model is ready when
its reference resolves and it may be served (it starts on its first request).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from math import prod
from typing import Any, TypeVar

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from pydantic_core import to_json
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from api import protocol, serving
from api.errors import BadImageError, TooLargeError
from api.model_process import Probabilities, Replicas
from api.protocol import (
    InferRequest,
    InferResponse,
    InputTensor,
    ModelMetadata,
    ProtocolError,
    ProtocolErrorOut,
    ServerMetadata,
)
from api.routers.health import readiness
from api.serving import Call, Upload
from core import model_registry
from core.db.session import session_scope
from core.db.tables import ModelVersion
from core.errors import InvalidError
from core.owners import Caller
from core.settings import Settings
from training.data import DatasetInfo

router = APIRouter(prefix="/v2", tags=["inference (Open Inference Protocol v2)"])
PREFIX = router.prefix

INPUT, IMAGE_BYTES, PROBABILITIES = "INPUT", "IMAGE_BYTES", "PROBABILITIES"
PLATFORM = "pytorch"
_T = TypeVar("_T")
JSON_OVERHEAD = 64 * 1024  # the JSON header and the BYTES elements' lengths, generously
INLINE_JSON = 64 * 1024  # a JSON header up to this size is parsed on the event loop
JSON_SLACK = 1024  # JSON values beside a tensor's elements: names, shapes, parameters


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
    if len(parts) == 4 and parts[1] == "versions" and parts[2].isdigit():
        return f"{parts[0]}/{parts[2]}"
    return None


def model_ref(name: str, version: str | None) -> str:
    """The predict route's reference for a model name and an optional version."""
    if version is None:
        return name
    if not (version.isascii() and version.isdigit() and 1 <= int(version) <= protocol.MAX_INT):
        raise InvalidError(
            f"version {version!r} must be a version number from 1 to {protocol.MAX_INT}, e.g. 1"
        )
    if "@" in name:
        raise InvalidError(f"model {name!r} names an alias: give an alias or a version, not both")
    return f"{name}/{version}"


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
    await _target(request, request.path_params["name"], None)
    return _json({"ready": True})


@router.get(
    "/models/{name}/versions/{version}/ready",
    summary="The model version is ready",
    responses=_errors(400, 401, 403, 404, 409, 503),
    openapi_extra={"parameters": [_NAME, _VERSION]},
)
async def version_ready(request: Request) -> Response:
    """200 when version `version` resolves and may be served."""
    path = request.path_params
    await _target(request, path["name"], path["version"])
    return _json({"ready": True})


async def _target(request: Request, name: str, version: str | None) -> model_registry.Resolved:
    """The model a metadata or ready request names, if the caller (read scope) sees it."""
    settings: Settings = request.app.state.settings
    principal = serving.principal_of(request, settings, "read")
    ref = model_ref(name, version)
    refs = request.scope["state"]["refs"]
    ttl_s = settings.predict_ref_ttl_ms / 1000
    target: model_registry.Resolved = await refs.resolve(
        ref, ttl_s, lambda: serving.resolve(settings, ref)
    )
    target.check_visible(Caller(principal, own_reads_only=settings.reads_owner_only))
    return target


async def _metadata(request: Request, name: str, version: str | None) -> Response:
    target = await _target(request, name, version)
    settings: Settings = request.app.state.settings
    served = await serving.load(settings, request.scope["state"]["model_cache"], target)
    versions = [str(target.version)] if version is not None or target.model is None else []
    if not versions:
        versions = await run_in_threadpool(_versions, settings, target)
    info = served.info
    height, width = info.image_size
    body = ModelMetadata.model_validate(
        {
            "name": name,
            "versions": versions,
            "platform": PLATFORM,
            "inputs": [
                {"name": INPUT, "datatype": "UINT8", "shape": [-1, height, width, info.channels]},
                {"name": IMAGE_BYTES, "datatype": "BYTES", "shape": [-1]},
            ],
            "outputs": [
                {"name": PROBABILITIES, "datatype": "FP32", "shape": [-1, info.num_classes]}
            ],
        }
    )
    return Response(body.model_dump_json(), media_type="application/json")


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
async def version_infer(request: Request) -> Response:
    """Class probabilities (or top-k classes) of a batch of images, by version `version`."""
    path = request.path_params
    return await _infer(request, path["name"], path["version"])


async def _infer(request: Request, name: str, version: str | None) -> Response:
    """The shared hot path, admitted before the body is read; the answer in the protocol's
    form."""
    settings: Settings = request.app.state.settings
    principal = serving.principal_of(request, settings, "predict")
    call = await serving.admit(request, model_ref(name, version), principal)
    status = 500
    try:
        answer = await _answer(request, call)
        status = 200
    except Exception as error:
        status = serving.status_of(error)
        if status == 422:  # answered as the protocol's 400 (api.edge.PublicErrors)
            status = 400
        raise
    finally:
        call.release(status)
    return answer


async def _answer(request: Request, call: Call) -> Response:
    body = await request.body()
    try:
        header, tail = protocol.split_body(body, request.headers.get(protocol.HEADER_LENGTH))
    except ProtocolError as error:
        raise BadImageError(str(error)) from None
    # A large body is worked on in a thread (pydantic parses JSON without the GIL): the
    # event loop serves other requests meanwhile.
    offload = len(body) > INLINE_JSON
    if len(header) > INLINE_JSON:  # a tensor in JSON: refused before a parse builds it
        _check_values(call.settings, (await call.model()).info, header)
    sent, raw = await _run(offload, _parsed, header, tail)
    if len(sent.inputs) != 1:
        names = ", ".join(repr(tensor.name) for tensor in sent.inputs)
        raise BadImageError(f"send one input, {INPUT} or {IMAGE_BYTES}; got {names}")
    tensor, data = sent.inputs[0], raw[0]
    wanted = _outputs(sent)
    count = _count(call.settings, tensor)
    if tensor.name == IMAGE_BYTES:
        files = await _run(offload, _files, tensor, data, count)
        served, _, probabilities = await serving.classify_files(call, files, strict=True)
    else:
        served = await call.model()
        _check_fit(tensor, served.info)
        array = await _run(offload, _uint8, tensor, data)
        probabilities = await call.forward(served, array)
    return _response(sent, wanted, call.target, served, probabilities)


async def _run(offload: bool, work: Callable[..., _T], *args: Any) -> _T:
    """`work(*args)`, in a thread if `offload`."""
    return await run_in_threadpool(work, *args) if offload else work(*args)


def _check_values(settings: Settings, info: DatasetInfo, header: bytes) -> None:
    """413 for a JSON header with more values than the most images of the model's input.

    Each array element or object member after a container's first follows a comma (and
    base64 has none), so counting commas bounds what a parse would build, without one.
    """
    height, width = info.image_size
    per_image = height * width * info.channels
    most = settings.predict_max_files * per_image
    values = header.count(b",") + 1
    if values > most + JSON_SLACK:
        raise TooLargeError(
            f"the JSON body holds {values:,} values or more, past the {most:,} of "
            f"{settings.predict_max_files} images of this model's [{height}, {width}, "
            f"{info.channels}] input; send fewer images per request, or the tensor as "
            "binary data"
        )


def _parsed(header: bytes, tail: memoryview) -> tuple[InferRequest, list[memoryview | None]]:
    """The request's JSON header and each input's raw bytes (None: its data is in the JSON)."""
    try:
        sent = InferRequest.model_validate_json(header)
        return sent, list(protocol.binary_inputs(sent, tail))
    except ValidationError as error:
        raise BadImageError(f"the inference request is malformed: {_first(error)}") from None
    except ProtocolError as error:
        raise BadImageError(str(error)) from None


def _first(error: ValidationError) -> str:
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"]) or "body"
    return f"{where}: {problem['msg']}"


def _count(settings: Settings, tensor: InputTensor) -> int:
    """The batch size of the input, within the images-per-request limit."""
    expected = {INPUT: ("UINT8", 4), IMAGE_BYTES: ("BYTES", 1)}.get(tensor.name)
    if expected is None:
        raise BadImageError(
            f"unknown input {tensor.name!r}; this model takes {INPUT} or {IMAGE_BYTES}"
        )
    datatype, rank = expected
    if tensor.datatype != datatype or len(tensor.shape) != rank:
        raise BadImageError(
            f"input {tensor.name!r} must be {datatype} of rank {rank}; got {tensor.datatype} "
            f"{tensor.shape}"
        )
    count = tensor.shape[0]
    if count > settings.predict_max_files:
        raise TooLargeError(
            f"{count} images is over the limit of {settings.predict_max_files} per request; "
            "send them in several requests"
        )
    return count


def _files(tensor: InputTensor, raw: memoryview | None, count: int) -> list[Upload]:
    """A BYTES input's elements as uploaded files, named `IMAGE_BYTES[i]`."""
    if raw is not None:
        try:
            elements = protocol.bytes_elements(tensor.name, raw, count)
        except ProtocolError as error:
            raise BadImageError(str(error)) from None
    else:
        elements = _base64_elements(tensor, count)
    return [
        Upload(f"{tensor.name}[{index}]", element, len(element))
        for index, element in enumerate(elements)
    ]


def _base64_elements(tensor: InputTensor, count: int) -> list[bytes]:
    """A BYTES input's JSON data: `count` base64 strings (flat or nested)."""
    data = tensor.data
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], list):
        data = data[0]
    if (
        not isinstance(data, list)
        or len(data) != count
        or not all(isinstance(d, str) for d in data)
    ):
        raise BadImageError(
            f"input {tensor.name!r}: data must be {count} base64-encoded files (or send them "
            "as binary data)"
        )
    try:
        return [base64.b64decode(element, validate=True) for element in data]
    except (binascii.Error, ValueError) as error:
        raise BadImageError(f"input {tensor.name!r}: data is not base64 ({error})") from None


def _check_fit(tensor: InputTensor, info: DatasetInfo) -> None:
    """An (N, H, W, C) input must have the model's input size (checked before its data)."""
    height, width = info.image_size
    if tuple(tensor.shape[1:]) != (height, width, info.channels):
        raise BadImageError(
            f"input {INPUT!r}: shape {tensor.shape} does not fit this model's "
            f"[-1, {height}, {width}, {info.channels}]; send encoded files as {IMAGE_BYTES} to "
            "have them resized"
        )


def _uint8(tensor: InputTensor, raw: memoryview | None) -> np.ndarray:
    """A UINT8 (N, H, W, C) input as the model's uint8 (N, C, H, W); its values must be
    bytes, as many as its shape says (counted before they are converted)."""
    shape = tuple(tensor.shape)
    if raw is not None:
        if len(raw) != prod(shape):
            raise BadImageError(
                f"input {tensor.name!r}: {len(raw):,} bytes of binary data for shape "
                f"{list(shape)} ({prod(shape):,} expected)"
            )
        array = np.frombuffer(raw, dtype=np.uint8).reshape(shape)
    else:
        array = _json_uint8(tensor, shape)
    return np.ascontiguousarray(array.transpose(0, 3, 1, 2))


def _json_uint8(tensor: InputTensor, shape: tuple[int, ...]) -> np.ndarray:
    """A UINT8 input's JSON data, flat or nested as its shape, as an array of that shape."""
    data = tensor.data
    expected = f"input {tensor.name!r}: data must be {prod(shape):,} integers 0..255"
    if not isinstance(data, list):
        raise BadImageError(f"{expected} (or send them as binary data)")
    nested = bool(data) and isinstance(data[0], list)
    if len(data) != (shape[0] if nested else prod(shape)):
        raise BadImageError(
            f"{expected}, flat or nested as shape {list(shape)}; got {len(data):,} "
            f"{'rows' if nested else 'elements'}"
        )
    try:
        values = np.asarray(data)
    except (TypeError, ValueError, OverflowError):  # ragged, or an int past 64 bits
        raise BadImageError(f"{expected}, nested as shape {list(shape)}") from None
    if values.shape not in (shape, (prod(shape),)) or values.dtype.kind not in "iu":
        raise BadImageError(f"{expected}, nested as shape {list(shape)}")
    if values.size and (values.min() < 0 or values.max() > 255):
        raise BadImageError(f"input {tensor.name!r}: UINT8 values must be 0..255")
    return values.astype(np.uint8).reshape(shape)


_Wanted = tuple[bool, int | None]  # binary, top-k classes


def _outputs(sent: InferRequest) -> _Wanted:
    """How the one output is wanted: binary or JSON, probabilities or top-k classes."""
    binary = sent.parameters.binary_data_output if sent.parameters else False
    if sent.outputs is None:
        return binary, None
    for output in sent.outputs:
        if output.name != PROBABILITIES:
            raise BadImageError(f"unknown output {output.name!r}; this model gives {PROBABILITIES}")
    if len(sent.outputs) != 1:
        raise BadImageError(f"ask for {PROBABILITIES} once")
    parameters = sent.outputs[0].parameters
    if parameters is None:
        return binary, None
    return parameters.binary_data or binary, parameters.classification


def _response(
    sent: InferRequest,
    wanted: _Wanted,
    target: model_registry.Resolved,
    served: Replicas,
    probabilities: Probabilities,
) -> Response:
    """The answer: JSON, or the JSON header and the output's raw bytes."""
    binary, top_k = wanted
    if top_k is None:
        output: dict[str, Any] = {
            "name": PROBABILITIES,
            "datatype": "FP32",
            "shape": list(probabilities.shape),
        }
        raw = probabilities.astype("<f4", copy=False).tobytes() if binary else b""
        if not binary:
            output["data"] = probabilities.ravel().tolist()
    else:
        labels = _classes(probabilities, served.info.classes, top_k)
        output = {
            "name": PROBABILITIES,
            "datatype": "BYTES",
            "shape": [len(labels), len(labels[0])],
        }
        flat = [label for row in labels for label in row]
        raw = protocol.bytes_raw([label.encode() for label in flat]) if binary else b""
        if not binary:
            output["data"] = flat
    if binary:
        output["parameters"] = {"binary_data_size": len(raw)}
    body: dict[str, Any] = {
        "model_name": target.model or str(target.job_id),
        "model_version": "" if target.version is None else str(target.version),
        "outputs": [output],
    }
    if sent.id is not None:
        body["id"] = sent.id
    header = to_json(body)
    if not binary:
        return Response(header, media_type="application/json")
    headers = {"Inference-Header-Content-Length": str(len(header))}
    return Response(header + raw, media_type="application/octet-stream", headers=headers)


def _classes(probabilities: Probabilities, classes: tuple[str, ...], top_k: int) -> list[list[str]]:
    """Per image, its top-k "score:index:label" strings (the classification extension)."""
    k = min(top_k, len(classes))
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return [
        [f"{row[i]:f}:{i}:{classes[i]}" for i in indices.tolist()]
        for row, indices in zip(probabilities, order, strict=True)
    ]


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(to_json(body), status_code=status, media_type="application/json")
