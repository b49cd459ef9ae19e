"""The Open Inference Protocol (KServe v2) over gRPC, `inference.GRPCInferenceService`, beside
HTTP's `/v2`, in the API process on the same event loop (started and stopped by the app's
lifespan, `api.app`, when GRPC_PORT is set).

ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata and ModelInfer answer as
their `/v2` routes do (`api.routers.inference`); the other RPCs of Triton's service answer
UNIMPLEMENTED. A model is named as there (`model_name` a name, `name@alias` or a job id;
`model_version` a version number or empty). ModelInfer takes its one input as
`raw_input_contents` or as typed `contents` (`uint_contents` for UINT8, `bytes_contents`
for BYTES) and answers with `raw_output_contents`; the classification extension is the
output's `classification` parameter.

Every call is the same data plane call as HTTP's (`serving.dataplane.DataPlane`): ModelInfer
is translated into the protocol's binary tensor form (a JSON header, the inputs' bytes
after it, every output asked in binary) and answered by `DataPlane.infer`, so admission,
the queue, micro-batching, owners, limits, refusals and metrics are HTTP's, byte for byte
the same tensors. The metrics count a refusal under the status HTTP would answer. A
message is bounded as an HTTP infer body is (`inference.body_limit`); unlike HTTP's, it
is read whole before admission (gRPC hands over messages whole). At most MAX_CONNECTIONS
calls are under way at once.

Keys come from the `authorization: Bearer rs_...` metadata and are checked as HTTP checks
them (`api.deps.check_key`, the app's cache of checked keys; the predict scope to infer,
read to describe). A refusal is the HTTP message under a gRPC status: 400, 413, 415 and
422 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 409
FAILED_PRECONDITION, a full queue RESOURCE_EXHAUSTED and an unreachable store or database
UNAVAILABLE, both with `retry-after` (seconds, as HTTP's header) and
`grpc-retry-pushback-ms` (gRPC's own retry hint) in the trailing metadata.

The service is Triton's generated code, `tritonclient.grpc.service_pb2(_grpc)`: Triton's
`inference` package is a superset of KServe v2's `grpc_predict_v2.proto` with the same
messages and field numbers, so every KServe v2 client speaks to it. Depending on those
stubs (tritonclient[grpc], a main dependency) needs no proto file, no generation step
and no grpcio-tools, and they are built and tested by their makers against the grpcio
and protobuf releases they accept.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import grpc
from fastapi import FastAPI
from pydantic_core import to_json
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from api.deps import KeyCache, check_key, check_scope
from api.edge import bearer_key
from api.errors import KEY_REQUIRED, UnauthorizedError, refusal_of
from api.routers import inference
from api.routers.health import readiness
from core.owners import Caller
from core.redaction import public_text
from core.settings import Settings
from serving import infer, protocol
from serving.dataplane import DataPlane
from serving.errors import BadInputError, OverloadedError
from serving.protocol import InferResponse

log = logging.getLogger(__name__)
_T = TypeVar("_T")
STOP_GRACE_S = 5.0  # calls under way when the server stops may finish within this time
KEY_REFUSED = "the API key is malformed, unknown or revoked"

# The gRPC status of each HTTP status a refusal has (a full queue's 503 is apart).
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
}


@asynccontextmanager
async def served(app: FastAPI, plane: DataPlane) -> AsyncIterator[grpc.aio.Server | None]:
    """The gRPC server of `app` on GRPC_HOST:GRPC_PORT while the block runs (None: off)."""
    settings: Settings = app.state.settings
    if not settings.grpc_port:
        yield None
        return
    server = grpc.aio.server(
        # As MAX_CONNECTIONS bounds HTTP's requests; beyond, RESOURCE_EXHAUSTED.
        maximum_concurrent_rpcs=settings.max_connections,
        options=[
            # Another process on the port is an error, not a silent share of its calls.
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", inference.body_limit(settings)),
        ],
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(app, plane), server)
    address = address_of(settings.grpc_host, settings.grpc_port)
    try:
        server.add_insecure_port(address)
    except RuntimeError as error:
        raise RuntimeError(
            f"gRPC cannot listen on {address} (in use, or no such interface); "
            "choose another GRPC_PORT, or 0 to serve HTTP only"
        ) from error
    await server.start()
    log.info("the Open Inference Protocol over gRPC listens on %s", address)
    try:
        yield server
    finally:
        await server.stop(STOP_GRACE_S)


def address_of(host: str, port: int) -> str:
    """gRPC's `host:port` (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


Handler = Callable[[Any, Any, Any], Awaitable[_T]]


def _refusals(handler: Handler[_T]) -> Handler[_T]:
    """An RPC whose refusals end the call with their gRPC status and HTTP's message."""

    @functools.wraps(handler)
    async def answered(service: InferenceService, request: Any, context: Any) -> _T:
        try:
            return await handler(service, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            code, message, hint = status_of(error, service.settings, handler.__name__)
            await context.abort(code, message, trailing_metadata=hint)
            raise  # not reached: abort raises

    return answered


Metadata = tuple[tuple[str, str], ...]


def status_of(error: Exception, settings: Settings, rpc: str) -> tuple[Any, str, Metadata]:
    """A refusal's gRPC status, HTTP's message (its server paths made public) and its retry
    hint (empty: none); an unexpected error's INTERNAL, its traceback logged under an id."""
    refusal = refusal_of(error)
    if refusal is None:
        error_id = uuid.uuid4().hex
        log.error("error id %s: gRPC %s failed", error_id, rpc, exc_info=error)
        message = f"an unexpected error occurred; quote error id {error_id} when reporting it"
        return grpc.StatusCode.INTERNAL, message, (("x-error-id", error_id),)
    code = CODES.get(refusal.status, grpc.StatusCode.UNKNOWN)
    if isinstance(error, OverloadedError):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retry = (refusal.headers or {}).get("Retry-After")
    hint: Metadata = ()
    if retry is not None:
        hint = (("retry-after", retry), ("grpc-retry-pushback-ms", str(int(retry) * 1000)))
    return code, public_text(refusal.message, settings), hint


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """`inference.GRPCInferenceService` of one API process: its app's settings, keys and
    data plane."""

    def __init__(self, app: FastAPI, plane: DataPlane) -> None:
        self.settings: Settings = app.state.settings
        self.keys: KeyCache = app.state.keys
        self.name, self.version = app.title, app.version
        self.plane = plane

    async def _caller(self, context: Any, scope: str) -> Caller:
        """Who calls, from the `authorization` metadata, if the key holds `scope`."""
        settings = self.settings
        if not settings.auth_enabled:
            return Caller(None, own_reads_only=settings.reads_owner_only)
        sent = dict(context.invocation_metadata() or ()).get("authorization", "")
        key = bearer_key(sent if isinstance(sent, str) else "")
        principal = await check_key(self.keys, settings, key) if key else None
        if principal is None:
            raise UnauthorizedError(KEY_REFUSED if key else KEY_REQUIRED)
        check_scope(principal, scope)
        return Caller(principal, own_reads_only=settings.reads_owner_only)

    # --- server -----------------------------------------------------------------------

    @_refusals
    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Live while the process serves calls."""
        return pb.ServerLiveResponse(live=True)

    @_refusals
    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Ready when the database and the broker answer (as /v2/health/ready)."""
        checks = await readiness(self.settings)
        return pb.ServerReadyResponse(ready=all(result == "ok" for result in checks.values()))

    @_refusals
    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        """The server's name, version and protocol extensions (as GET /v2)."""
        return pb.ServerMetadataResponse(
            name=self.name, version=self.version, extensions=list(protocol.EXTENSIONS)
        )

    # --- models -----------------------------------------------------------------------

    @_refusals
    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Ready when the model resolves and may be served; else HTTP's refusal."""
        caller = await self._caller(context, "read")
        await self.plane.ready(request.name, request.version or None, caller)
        return pb.ModelReadyResponse(ready=True)

    @_refusals
    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        """A model's versions, inputs and outputs (as GET /v2/models/{name})."""
        caller = await self._caller(context, "read")
        metadata = await self.plane.metadata(request.name, request.version or None, caller)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=metadata.name,
            versions=metadata.versions,
            platform=metadata.platform,
            inputs=[tensor(**item.model_dump()) for item in metadata.inputs],
            outputs=[tensor(**item.model_dump()) for item in metadata.outputs],
        )

    # --- infer ------------------------------------------------------------------------

    @_refusals
    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Class probabilities (or top-k classes) of a batch of images."""
        caller = await self._caller(context, "predict")
        ref = infer.model_ref(request.model_name, request.model_version or None)
        header, tail = binary_form(request)

        async def read() -> bytes:  # joined once admitted: a refused call copies nothing
            return header + b"".join(tail)

        (answer, raw), _ = await self.plane.infer(
            ref, caller, read, str(len(header)), status_of=inference.status_of
        )
        return _response(InferResponse.model_validate_json(answer), raw)


def binary_form(request: Any) -> tuple[bytes, list[bytes]]:
    """A ModelInferRequest as an HTTP infer body in the binary tensor form: its JSON header,
    and the inputs' bytes that follow it."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadInputError(
            f"raw_input_contents holds {len(raw)} entries for {len(request.inputs)} inputs; "
            "send one per input, in input order"
        )
    inputs, tail = [], []
    for index, tensor in enumerate(request.inputs):
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        data = _data(tensor, raw[index] if raw else None, entry)
        if data is not None:
            entry["parameters"] = {"binary_data_size": len(data)}
            tail.append(data)
        inputs.append(entry)
    outputs = [
        {"name": output.name, "parameters": {**_values(output.parameters), "binary_data": True}}
        for output in request.outputs
    ]
    sent: dict[str, Any] = {"inputs": inputs, "parameters": {"binary_data_output": True}}
    if outputs:
        sent["outputs"] = outputs
    if request.id:
        sent["id"] = request.id
    return to_json(sent), tail


def _data(tensor: Any, raw: bytes | None, entry: dict[str, Any]) -> bytes | None:
    """An input's bytes in the binary form (None: none, or its values put in `entry`)."""
    contents = tensor.contents if tensor.HasField("contents") else None
    if raw is not None:
        if contents is not None and contents.ListFields():
            raise BadInputError(
                f"input {tensor.name!r} has both contents and raw_input_contents; send one"
            )
        return raw
    if contents is None:
        return None
    if tensor.datatype == "BYTES":
        return protocol.bytes_raw(list(contents.bytes_contents))
    if tensor.datatype == "UINT8":
        entry["data"] = list(contents.uint_contents)  # checked as JSON data is: 0..255
    return None


def _values(parameters: Any) -> dict[str, Any]:
    """A parameter map's values (an `InferParameter` holds one of several kinds)."""
    values = {}
    for name, parameter in parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        if kind is not None:
            values[name] = getattr(parameter, kind)
    return values


def _response(answer: InferResponse, raw: bytes | None) -> Any:
    """The data plane's answer (every output in binary form) as a ModelInferResponse."""
    outputs = [
        pb.ModelInferResponse.InferOutputTensor(
            name=output.name, datatype=output.datatype, shape=output.shape
        )
        for output in answer.outputs
    ]
    return pb.ModelInferResponse(
        model_name=answer.model_name,
        model_version=answer.model_version or "",
        id=answer.id or "",
        outputs=outputs,
        raw_output_contents=[raw or b""],
    )
