"""The Open Inference Protocol's infer, HTTP-free: a request's tensors in, its answer out.

A model takes one input, either `INPUT`, a UINT8 tensor [N, H, W, C] already at the
model's input size (normalised in the model's process as a decoded file is), or
`IMAGE_BYTES`, a BYTES tensor [N] of encoded image files (checked and decoded exactly as a
multipart file: same formats, limits and refusals). It gives `PROBABILITIES`, FP32
[N, classes], or with `parameters.classification: k` on the output, BYTES [N, k]
"score:index:label" strings. Inputs and outputs may be JSON or raw bytes after the JSON
header (the binary tensor data extension). Unlike a multipart request, one bad image
fails the whole request.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from math import prod
from typing import Any, Protocol, TypeVar

import numpy as np
from pydantic import ValidationError
from pydantic_core import to_json
from starlette.concurrency import run_in_threadpool

from core.errors import InvalidError
from core.model_registry import Resolved
from core.settings import Settings
from serving import protocol
from serving.errors import BadInputError, InputTooLargeError
from serving.files import Checked, Upload
from serving.process import Images, Probabilities, Replicas
from serving.protocol import InferRequest, InputTensor, ProtocolError
from training.data import DatasetInfo

INPUT, IMAGE_BYTES, PROBABILITIES = "INPUT", "IMAGE_BYTES", "PROBABILITIES"
_T = TypeVar("_T")
INLINE_JSON = 64 * 1024  # a JSON header up to this size is parsed on the event loop
JSON_SLACK = 1024  # JSON values beside a tensor's elements: names, shapes, parameters

# The answer: its JSON header, and the output's raw bytes when it is sent in binary form.
Answer = tuple[bytes, bytes | None]


class Admitted(Protocol):
    """What an infer request needs of its admitted call (the data plane's `Call`)."""

    settings: Settings
    target: Resolved

    async def model(self) -> Replicas: ...

    async def forward(self, served: Replicas, batch: Images) -> Probabilities: ...

    async def classify(
        self, files: list[Upload], *, strict: bool = False
    ) -> tuple[Replicas, list[Checked], Probabilities]: ...


async def answer(call: Admitted, body: bytes, header_length: str | None) -> Answer:
    """The answer to an admitted infer request's body (its JSON header and binary data)."""
    try:
        header, tail = protocol.split_body(body, header_length)
    except ProtocolError as error:
        raise BadInputError(str(error)) from None
    # A large body is worked on in a thread (pydantic parses JSON without the GIL): the
    # event loop serves other requests meanwhile.
    offload = len(body) > INLINE_JSON
    if len(header) > INLINE_JSON:  # a tensor in JSON: refused before a parse builds it
        _check_values(call.settings, (await call.model()).info, header)
    sent, raw = await _run(offload, _parsed, header, tail)
    if len(sent.inputs) != 1:
        names = ", ".join(repr(tensor.name) for tensor in sent.inputs)
        raise BadInputError(f"send one input, {INPUT} or {IMAGE_BYTES}; got {names}")
    tensor, data = sent.inputs[0], raw[0]
    wanted = _outputs(sent)
    count = _count(call.settings, tensor)
    if tensor.name == IMAGE_BYTES:
        files = await _run(offload, _files, tensor, data, count)
        served, _, probabilities = await call.classify(files, strict=True)
    else:
        served = await call.model()
        _check_fit(tensor, served.info)
        array = await _run(offload, _uint8, tensor, data)
        probabilities = await call.forward(served, array)
    return _response(sent, wanted, call.target, served, probabilities)


async def _run(offload: bool, work: Callable[..., _T], *args: Any) -> _T:
    """`work(*args)`, in a thread if `offload`."""
    return await run_in_threadpool(work, *args) if offload else work(*args)


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
        raise InputTooLargeError(
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
        raise BadInputError(f"the inference request is malformed: {_first(error)}") from None
    except ProtocolError as error:
        raise BadInputError(str(error)) from None


def _first(error: ValidationError) -> str:
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"]) or "body"
    return f"{where}: {problem['msg']}"


def _count(settings: Settings, tensor: InputTensor) -> int:
    """The batch size of the input, within the images-per-request limit."""
    expected = {INPUT: ("UINT8", 4), IMAGE_BYTES: ("BYTES", 1)}.get(tensor.name)
    if expected is None:
        raise BadInputError(
            f"unknown input {tensor.name!r}; this model takes {INPUT} or {IMAGE_BYTES}"
        )
    datatype, rank = expected
    if tensor.datatype != datatype or len(tensor.shape) != rank:
        raise BadInputError(
            f"input {tensor.name!r} must be {datatype} of rank {rank}; got {tensor.datatype} "
            f"{tensor.shape}"
        )
    count = tensor.shape[0]
    if count > settings.predict_max_files:
        raise InputTooLargeError(
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
            raise BadInputError(str(error)) from None
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
        raise BadInputError(
            f"input {tensor.name!r}: data must be {count} base64-encoded files (or send them "
            "as binary data)"
        )
    try:
        return [base64.b64decode(element, validate=True) for element in data]
    except (binascii.Error, ValueError) as error:
        raise BadInputError(f"input {tensor.name!r}: data is not base64 ({error})") from None


def _check_fit(tensor: InputTensor, info: DatasetInfo) -> None:
    """An (N, H, W, C) input must have the model's input size (checked before its data)."""
    height, width = info.image_size
    if tuple(tensor.shape[1:]) != (height, width, info.channels):
        raise BadInputError(
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
            raise BadInputError(
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
        raise BadInputError(f"{expected} (or send them as binary data)")
    nested = bool(data) and isinstance(data[0], list)
    if len(data) != (shape[0] if nested else prod(shape)):
        raise BadInputError(
            f"{expected}, flat or nested as shape {list(shape)}; got {len(data):,} "
            f"{'rows' if nested else 'elements'}"
        )
    try:
        values = np.asarray(data)
    except (TypeError, ValueError, OverflowError):  # ragged, or an int past 64 bits
        raise BadInputError(f"{expected}, nested as shape {list(shape)}") from None
    if values.shape not in (shape, (prod(shape),)) or values.dtype.kind not in "iu":
        raise BadInputError(f"{expected}, nested as shape {list(shape)}")
    if values.size and (values.min() < 0 or values.max() > 255):
        raise BadInputError(f"input {tensor.name!r}: UINT8 values must be 0..255")
    return values.astype(np.uint8).reshape(shape)


_Wanted = tuple[bool, int | None]  # binary, top-k classes


def _outputs(sent: InferRequest) -> _Wanted:
    """How the one output is wanted: binary or JSON, probabilities or top-k classes."""
    binary = sent.parameters.binary_data_output if sent.parameters else False
    if sent.outputs is None:
        return binary, None
    for output in sent.outputs:
        if output.name != PROBABILITIES:
            raise BadInputError(f"unknown output {output.name!r}; this model gives {PROBABILITIES}")
    if len(sent.outputs) != 1:
        raise BadInputError(f"ask for {PROBABILITIES} once")
    parameters = sent.outputs[0].parameters
    if parameters is None:
        return binary, None
    return parameters.binary_data or binary, parameters.classification


def _response(
    sent: InferRequest,
    wanted: _Wanted,
    target: Resolved,
    served: Replicas,
    probabilities: Probabilities,
) -> Answer:
    """The answer: its JSON, and the output's raw bytes if it is wanted in binary form."""
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
    return to_json(body), raw if binary else None


def _classes(probabilities: Probabilities, classes: tuple[str, ...], top_k: int) -> list[list[str]]:
    """Per image, its top-k "score:index:label" strings (the classification extension)."""
    k = min(top_k, len(classes))
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return [
        [f"{row[i]:f}:{i}:{classes[i]}" for i in indices.tolist()]
        for row, indices in zip(probabilities, order, strict=True)
    ]
