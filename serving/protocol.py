"""The Open Inference Protocol's (KServe v2) shapes: pydantic I/O and the binary tensor form.

The binary tensor data extension (as Triton defines it): a request's JSON header is the
first `Inference-Header-Content-Length` bytes of the body, and the raw bytes of each
input whose `parameters.binary_data_size` is set follow it, in input order; an answer's
outputs with `binary_data` are sent the same way. A BYTES tensor's elements are each a
4-byte little-endian length, then that many bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

HEADER_LENGTH = "inference-header-content-length"
EXTENSIONS = ("classification", "binary_tensor_data")
_ELEMENT_LENGTH = struct.Struct("<I")
MAX_INT = 2**31 - 1  # the largest dimension or version number (the database's integer)

Dimension = Annotated[int, Field(ge=1, le=MAX_INT)]


class ProtocolError(ValueError):
    """A request that breaks the protocol's form (a 400), with a message naming where."""


class TensorParameters(BaseModel):
    """An input's parameters: the size of its raw bytes after the JSON header, if sent so."""

    model_config = ConfigDict(extra="allow")

    binary_data_size: int | None = Field(None, ge=0)


class InputTensor(BaseModel):
    """One input: `INPUT` (UINT8 [N, H, W, C]) or `IMAGE_BYTES` (BYTES [N], encoded files)."""

    name: str = Field(max_length=64, examples=["IMAGE_BYTES"])
    shape: list[Dimension] = Field(max_length=8, examples=[[1]])
    datatype: str = Field(max_length=16, examples=["BYTES"])
    parameters: TensorParameters | None = None
    data: Any = Field(
        None,
        description="Row-major elements, flat or nested; for BYTES, each file base64-encoded. "
        "Absent when the tensor's bytes follow the JSON header (binary_data_size).",
    )


class OutputParameters(BaseModel):
    """How an output is wanted: as raw bytes after the JSON, or as top-k classes."""

    model_config = ConfigDict(extra="allow")

    binary_data: bool = False
    classification: int | None = Field(
        None, ge=1, description='Top-k per image as BYTES "score:index:label" strings.'
    )


class RequestedOutput(BaseModel):
    """An output the client asks for: `PROBABILITIES`."""

    name: str = Field(max_length=64, examples=["PROBABILITIES"])
    parameters: OutputParameters | None = None


class RequestParameters(BaseModel):
    """The request's parameters: `binary_data_output` sends every output as raw bytes."""

    model_config = ConfigDict(extra="allow")

    binary_data_output: bool = False


class InferRequest(BaseModel):
    """An inference request: one input, the outputs wanted (all when absent), an id."""

    id: str | None = Field(None, max_length=256)
    parameters: RequestParameters | None = None
    inputs: list[InputTensor] = Field(min_length=1, max_length=8)
    outputs: list[RequestedOutput] | None = Field(None, max_length=8)


class OutputTensor(BaseModel):
    """One output: its data inline, or `parameters.binary_data_size` raw bytes after the
    JSON header."""

    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferResponse(BaseModel):
    """An inference answer: the model and version that answered, the request's id."""

    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[OutputTensor]


class TensorMetadata(BaseModel):
    """An input's or output's name, datatype and shape (-1: any size)."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    """What a model takes and gives."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(BaseModel):
    """The server's name, version and protocol extensions."""

    name: str
    version: str
    extensions: list[str]


class ProtocolErrorOut(BaseModel):
    """The protocol's error shape."""

    error: str = Field(examples=["model 'nobody' is not registered"])


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema with its definitions inlined (for a hand-written OpenAPI body)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inlined(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inlined(definitions[ref.removeprefix("#/$defs/")])
            return {key: inlined(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inlined(item) for item in node]
        return node

    result: dict[str, Any] = inlined(schema)
    return result


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """The JSON header of a request body and the binary data after it."""
    if header_length is None:
        return body, memoryview(b"")
    # isdigit() passes "²", and int() refuses it or 4,300 digits and more.
    digits = header_length.isascii() and header_length.isdigit() and len(header_length) < 20
    length = int(header_length) if digits else -1
    if not 0 <= length <= len(body):
        raise ProtocolError(
            f"Inference-Header-Content-Length {header_length!r} must be a byte count of at "
            f"most the body's {len(body):,} bytes"
        )
    return body[:length], memoryview(body)[length:]


def binary_inputs(request: InferRequest, tail: memoryview) -> Iterator[memoryview | None]:
    """Each input's raw bytes (None: its data is in the JSON), in input order; the sizes
    must add up to the binary data exactly."""
    offset = 0
    for tensor in request.inputs:
        size = tensor.parameters.binary_data_size if tensor.parameters else None
        if size is None:
            yield None
            continue
        if offset + size > len(tail):
            raise ProtocolError(
                f"input {tensor.name!r}: binary_data_size {size:,} is past the end of the "
                f"{len(tail):,} bytes after the JSON header"
            )
        yield tail[offset : offset + size]
        offset += size
    if offset != len(tail):
        raise ProtocolError(
            f"{len(tail) - offset:,} bytes after the JSON header belong to no input "
            "(each binary input needs parameters.binary_data_size)"
        )


def bytes_elements(name: str, raw: memoryview, count: int) -> list[bytes]:
    """The `count` elements of a BYTES tensor's raw form (4-byte length, then bytes)."""
    elements: list[bytes] = []
    offset = 0
    while offset < len(raw) and len(elements) < count:
        if offset + 4 > len(raw):
            break
        (length,) = _ELEMENT_LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise ProtocolError(
                f"input {name!r}: element {len(elements)} says {length:,} bytes, past the end "
                "of its binary data"
            )
        elements.append(bytes(raw[offset : offset + length]))
        offset += length
    if len(elements) != count or offset != len(raw):
        raise ProtocolError(
            f"input {name!r}: its binary data must hold exactly {count} elements, each a "
            "4-byte little-endian length and that many bytes"
        )
    return elements


def bytes_raw(elements: list[bytes]) -> bytes:
    """A BYTES tensor's raw form."""
    return b"".join(_ELEMENT_LENGTH.pack(len(element)) + element for element in elements)
