"""The Open Inference Protocol over gRPC (`inference.GRPCInferenceService`), driven by
Triton's own gRPC client and the generated stub against the API served by uvicorn, whose
lifespan serves gRPC on its own port: the same answers as HTTP's /v2 (health, metadata,
probabilities of UINT8 tensors and encoded PNGs, top-k classes), keys and owners checked
as HTTP checks them, HTTP's refusals under gRPC statuses, the queue shared with HTTP.

A tiny ResNet-8 (8x8 RGB synthetic data, two training steps) is registered as `tiny` by
an admin key; reads keep to their owner, so another key's calls find no `tiny`.
"""

from __future__ import annotations

import asyncio
import re
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from PIL import Image
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from api import grpc as api_grpc
from api.app import create_app
from cli.server import chosen_grpc_port
from core.errors import ConflictError
from core.settings import Settings
from serving.errors import UnavailableError
from tests import images
from tests.helpers import Key, key_of, trained_job, wait_for
from tests.services import free_port

SIZE = 8  # the tiny net's input: 8x8 RGB (tests.helpers.TINY)
QUEUE = 2  # PREDICT_QUEUE_SIZE here


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """gRPC on a port of its own; reads keep to their owner; a queue of two per model."""
    update = {"grpc_port": free_port(), "reads_owner_only": True, "predict_queue_size": QUEUE}
    return settings.model_copy(update=update)


@pytest.fixture(scope="module")
def admin(settings: Settings) -> Key:
    return key_of(settings.database_url, "admin")


@pytest.fixture(scope="module")
def tiny(live_url: str, settings: Settings, admin: Key) -> uuid.UUID:
    """`tiny` version 1, aliased `production`, owned by the admin key."""
    job_id = trained_job(settings)
    with httpx.Client(
        base_url=f"{live_url}/api/v1", headers=dict(admin.headers), timeout=60
    ) as http:
        added = http.post("/registry/tiny/versions", json={"job": str(job_id)})
        assert added.status_code == 201, added.text
        moved = http.put("/registry/tiny/aliases/production", json={"version": 1})
        assert moved.status_code == 200, moved.text
    return job_id


@pytest.fixture(scope="module")
def target(settings: Settings, live_url: str) -> str:
    """The gRPC server's address (the lifespan of the served API started it)."""
    return f"127.0.0.1:{settings.grpc_port}"


@pytest.fixture(scope="module")
def client(target: str) -> Iterator[triton_grpc.InferenceServerClient]:
    """Triton's gRPC client."""
    server = triton_grpc.InferenceServerClient(url=target)
    yield server
    server.close()


@pytest.fixture(scope="module")
def stub(target: str) -> Iterator[Any]:
    """The generated stub, for typed contents and trailing metadata."""
    with grpc.insecure_channel(target) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def http(live_url: str) -> Iterator[triton_http.InferenceServerClient]:
    """Triton's HTTP client of the same server's /v2."""
    server = triton_http.InferenceServerClient(url=live_url.removeprefix("http://"))
    yield server
    server.close()


def _grpc_auth(key: Key) -> dict[str, str]:
    """A key as gRPC metadata (HTTP's headers are copied where used: Triton's HTTP client
    adds its own to the dict it is given)."""
    return {"authorization": key.headers["Authorization"]}


def pixels(count: int, seed: int = 0) -> np.ndarray:
    """`count` 8x8 RGB images, uint8 [N, H, W, C]."""
    rng = np.random.default_rng(seed + count)
    return rng.integers(0, 256, (count, SIZE, SIZE, 3), dtype=np.uint8)


def png(array: np.ndarray) -> bytes:
    return images.encode(Image.fromarray(array, mode="RGB"))


def _inputs(module: Any, array: np.ndarray | None, files: list[bytes] | None) -> list[Any]:
    """One input of Triton's client `module` (http or grpc): UINT8 pixels or PNG files."""
    if array is not None:
        tensor = module.InferInput("INPUT", list(array.shape), "UINT8")
        data = array
    else:
        assert files is not None
        tensor = module.InferInput("IMAGE_BYTES", [len(files)], "BYTES")
        data = np.array(files, dtype=np.object_)
    if module is triton_http:
        tensor.set_data_from_numpy(data, binary_data=True)
    else:
        tensor.set_data_from_numpy(data)
    return [tensor]


def _refused(error: pytest.ExceptionInfo[InferenceServerException], code: str) -> str:
    """The message of a refused call of Triton's gRPC client, whose status was `code`."""
    assert error.value.status() == f"StatusCode.{code}", error.value
    return _stable(str(error.value.message()))


def _stable(message: str) -> str:
    """A message without the object addresses that a decoder's error may quote."""
    return re.sub(r" at 0x[0-9a-f]+", " at 0x...", message)


def _http_refusal(call: Callable[..., Any], *args: Any, **options: Any) -> str:
    """The message HTTP's /v2 refused `call(*args, **options)` with (Triton's HTTP client
    raises it)."""
    with pytest.raises(InferenceServerException) as refused:
        call(*args, **options)
    return _stable(str(refused.value.message()))


def test_server_health_and_metadata_equal_http(
    client: triton_grpc.InferenceServerClient, http: triton_http.InferenceServerClient
) -> None:
    assert client.is_server_live()
    assert http.is_server_live()
    assert client.is_server_ready()
    assert http.is_server_ready()
    metadata = client.get_server_metadata()
    expected = http.get_server_metadata()
    assert (metadata.name, metadata.version) == (expected["name"], expected["version"])
    assert list(metadata.extensions) == expected["extensions"]


def test_model_metadata_and_readiness_equal_http(
    client: triton_grpc.InferenceServerClient,
    http: triton_http.InferenceServerClient,
    admin: Key,
    tiny: uuid.UUID,
) -> None:
    auth = _grpc_auth(admin)
    for name, version in (("tiny@production", ""), ("tiny", "1"), (str(tiny), "")):
        metadata = client.get_model_metadata(name, version, headers=auth)
        expected = http.get_model_metadata(name, version, headers=dict(admin.headers))
        assert metadata.name == expected["name"]
        assert list(metadata.versions) == expected["versions"]
        assert metadata.platform == expected["platform"] == "pytorch"
        for kind in ("inputs", "outputs"):
            got = [(t.name, t.datatype, list(t.shape)) for t in getattr(metadata, kind)]
            assert got == [(t["name"], t["datatype"], t["shape"]) for t in expected[kind]]
        assert client.is_model_ready(name, version, headers=auth)
        assert http.is_model_ready(name, version, headers=dict(admin.headers))
    for name, version in (("tiny", "7"), ("nobody", "")):
        assert not http.is_model_ready(name, version, headers=dict(admin.headers))
        with pytest.raises(InferenceServerException) as refused:
            client.is_model_ready(name, version, headers=auth)
        message = _http_refusal(http.get_model_metadata, name, version, headers=dict(admin.headers))
        assert _refused(refused, "NOT_FOUND") == message


@pytest.mark.parametrize("form", ["uint8", "png"])
def test_probabilities_equal_http(
    client: triton_grpc.InferenceServerClient,
    http: triton_http.InferenceServerClient,
    admin: Key,
    tiny: uuid.UUID,
    form: str,
) -> None:
    array = pixels(3)
    sent = (array, None) if form == "uint8" else (None, [png(a) for a in array])
    result = client.infer(
        "tiny@production",
        _inputs(triton_grpc, *sent),
        request_id="req-1",
        headers=_grpc_auth(admin),
    )
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("tiny", "1", "req-1")
    probabilities = result.as_numpy("PROBABILITIES")
    assert probabilities.dtype == np.float32
    assert probabilities.shape == (3, 10)  # TINY has ten classes
    expected = http.infer(
        "tiny@production", _inputs(triton_http, *sent), headers=dict(admin.headers)
    )
    np.testing.assert_array_equal(probabilities, expected.as_numpy("PROBABILITIES"))

    top = [triton_grpc.InferRequestedOutput("PROBABILITIES", class_count=3)]
    classes = client.infer("tiny", _inputs(triton_grpc, *sent), "1", top, headers=_grpc_auth(admin))
    http_top = [triton_http.InferRequestedOutput("PROBABILITIES", binary_data=True, class_count=3)]
    labels = http.infer(
        "tiny", _inputs(triton_http, *sent), "1", http_top, headers=dict(admin.headers)
    )
    assert classes.as_numpy("PROBABILITIES").tolist() == labels.as_numpy("PROBABILITIES").tolist()


def test_typed_contents_equal_raw_contents(
    client: triton_grpc.InferenceServerClient, stub: Any, admin: Key, tiny: uuid.UUID
) -> None:
    array = pixels(2, seed=5)
    auth = tuple(_grpc_auth(admin).items())
    raw = client.infer("tiny", _inputs(triton_grpc, array, None), headers=_grpc_auth(admin))
    expected = raw.as_numpy("PROBABILITIES")

    def typed(tensor: Any) -> np.ndarray:
        request = pb.ModelInferRequest(model_name="tiny", inputs=[tensor])
        response = stub.ModelInfer(request, metadata=auth)
        assert [o.name for o in response.outputs] == ["PROBABILITIES"]
        (data,) = response.raw_output_contents
        return np.frombuffer(data, dtype="<f4").reshape(list(response.outputs[0].shape))

    pixel_input = pb.ModelInferRequest.InferInputTensor(
        name="INPUT",
        datatype="UINT8",
        shape=list(array.shape),
        contents=pb.InferTensorContents(uint_contents=array.ravel().tolist()),
    )
    np.testing.assert_array_equal(typed(pixel_input), expected)
    file_input = pb.ModelInferRequest.InferInputTensor(
        name="IMAGE_BYTES",
        datatype="BYTES",
        shape=[2],
        contents=pb.InferTensorContents(bytes_contents=[png(a) for a in array]),
    )
    np.testing.assert_array_equal(typed(file_input), expected)


def test_keys_and_owners_are_checked_as_http_checks_them(
    client: triton_grpc.InferenceServerClient,
    http: triton_http.InferenceServerClient,
    settings: Settings,
    tiny: uuid.UUID,
) -> None:
    array = pixels(1)
    grpc_inputs, http_inputs = _inputs(triton_grpc, array, None), _inputs(triton_http, array, None)

    def both(headers: dict[str, str], code: str, model: str = "tiny") -> str:
        """gRPC's refusal (`code`), equal to HTTP's message; that message."""
        with pytest.raises(InferenceServerException) as refused:
            client.infer(model, grpc_inputs, headers={k.lower(): v for k, v in headers.items()})
        message = _http_refusal(http.infer, model, http_inputs, headers=dict(headers))
        assert _refused(refused, code) == message
        return message

    assert "API key is required" in both({}, "UNAUTHENTICATED")
    assert "malformed, unknown or revoked" in both(
        {"Authorization": "Bearer rs_x_y"}, "UNAUTHENTICATED"
    )
    reader = key_of(settings.database_url, "read")
    assert "'predict' scope" in both(reader.headers, "PERMISSION_DENIED")
    other = key_of(settings.database_url, "predict", "read")  # owns nothing: finds no tiny
    assert "is not registered" in both(other.headers, "NOT_FOUND")
    assert "does not exist" in both(other.headers, "NOT_FOUND", model=str(tiny))
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_metadata("tiny", headers={})
    assert "API key is required" in _refused(refused, "UNAUTHENTICATED")
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_metadata("tiny", headers=_grpc_auth(other))
    assert "is not registered" in _refused(refused, "NOT_FOUND")


def test_malformed_tensors_are_invalid_arguments(
    client: triton_grpc.InferenceServerClient,
    http: triton_http.InferenceServerClient,
    stub: Any,
    admin: Key,
    tiny: uuid.UUID,
) -> None:
    def both(array: np.ndarray | None, files: list[bytes] | None, version: str = "") -> str:
        with pytest.raises(InferenceServerException) as refused:
            client.infer(
                "tiny", _inputs(triton_grpc, array, files), version, headers=_grpc_auth(admin)
            )
        http_inputs = _inputs(triton_http, array, files)
        auth = dict(admin.headers)
        message = _http_refusal(http.infer, "tiny", http_inputs, version, headers=auth)
        assert _refused(refused, "INVALID_ARGUMENT") == message
        return message

    assert "does not fit" in both(pixels(1)[:, :4], None)
    assert "IMAGE_BYTES[0]" in both(None, [png(pixels(1)[0])[:60]])
    assert "not an image" in both(None, [b"hello"])
    assert "over the limit" in both(pixels(17), None)
    assert "version" in both(pixels(1), None, version="x")

    auth = tuple(_grpc_auth(admin).items())
    short = pb.ModelInferRequest.InferInputTensor(
        name="INPUT", datatype="UINT8", shape=[1, 8, 8, 3]
    )
    cases = [
        ([short], [b"\0" * 10], "10 bytes of binary data"),
        ([short, short], [b"\0" * 192], "raw_input_contents holds 1 entries for 2 inputs"),
        ([], [], "inputs"),
    ]
    bright = pb.InferTensorContents(uint_contents=[300] * 192)
    cases.append(([pb.ModelInferRequest.InferInputTensor(
        name="INPUT", datatype="UINT8", shape=[1, 8, 8, 3], contents=bright
    )], [], "0..255"))  # fmt: skip
    for inputs, raw, fragment in cases:
        request = pb.ModelInferRequest(model_name="tiny", inputs=inputs, raw_input_contents=raw)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelInfer(request, metadata=auth)
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert fragment in failed.value.details()


def _held_infer(live_url: str, key: Key) -> socket.socket:
    """An HTTP /v2 infer whose body never comes: it holds a place in tiny's queue."""
    parts = urlsplit(live_url)
    held = socket.create_connection((parts.hostname, parts.port))
    held.sendall(
        b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Authorization: {key.headers['Authorization']}\r\n".encode()
        + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    )
    return held


def test_a_full_queue_is_resource_exhausted_with_a_retry_hint(
    live_url: str, stub: Any, admin: Key, tiny: uuid.UUID
) -> None:
    """HTTP and gRPC calls share the model's queue: two HTTP requests waiting for their
    bodies fill it, and a gRPC call is refused until they end."""
    array = pixels(1)
    request = pb.ModelInferRequest(
        model_name="tiny",
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="INPUT", datatype="UINT8", shape=list(array.shape)
            )
        ],
        raw_input_contents=[array.tobytes()],
    )
    auth = tuple(_grpc_auth(admin).items())
    stub.ModelInfer(request, metadata=auth)  # served: the model is loaded
    held = [_held_infer(live_url, admin) for _ in range(QUEUE)]
    try:

        def refused() -> grpc.RpcError | None:
            try:
                stub.ModelInfer(request, metadata=auth)
            except grpc.RpcError as error:
                return error
            return None

        error = wait_for(refused, 10, "a refusal while the queue is full")
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
        assert f"queue is full ({QUEUE} requests); retry in 1 s" in error.details()
        trailing = dict(error.trailing_metadata())
        assert trailing["retry-after"] == "1"
        assert trailing["grpc-retry-pushback-ms"] == "1000"
    finally:
        for connection in held:
            connection.close()
    wait_for(lambda: refused() is None, 10, "the queue to drain")


def test_grpc_calls_feed_the_models_metrics(
    client: triton_grpc.InferenceServerClient, live_url: str, admin: Key, tiny: uuid.UUID
) -> None:
    def count() -> float:
        metrics = httpx.get(f"{live_url}/api/v1/metrics", headers=dict(admin.headers)).text
        pattern = r'^resnet_model_images_total\{model="tiny/1"\} (\S+)$'
        found = re.search(pattern, metrics, re.MULTILINE)
        return float(found[1]) if found else 0.0

    before = count()
    client.infer(
        "tiny@production", _inputs(triton_grpc, pixels(3), None), headers=_grpc_auth(admin)
    )
    assert count() - before == 3


def test_triton_only_rpcs_are_unimplemented(stub: Any) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        stub.ModelConfig(pb.ModelConfigRequest(name="tiny"))
    assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_taken_port_stops_the_start_with_what_to_do(settings: Settings) -> None:
    """Another process on GRPC_PORT fails the server's start (no silent share of the port)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = create_app(settings.model_copy(update={"grpc_port": port}))

        async def start() -> None:
            async with api_grpc.served(app, plane=None):  # type: ignore[arg-type]
                pass

        with pytest.raises(RuntimeError, match=rf"cannot listen on 127.0.0.1:{port}.*GRPC_PORT"):
            asyncio.run(start())


def test_refusals_map_to_grpc_statuses_with_http_messages(settings: Settings) -> None:
    store_down = api_grpc.status_of(UnavailableError("the store is down"), settings, "ModelInfer")
    assert store_down == (
        grpc.StatusCode.UNAVAILABLE,
        "the store is down",
        (("retry-after", "5"), ("grpc-retry-pushback-ms", "5000")),
    )
    conflict = api_grpc.status_of(ConflictError("not servable"), settings, "ModelInfer")
    assert conflict == (grpc.StatusCode.FAILED_PRECONDITION, "not servable", ())
    code, message, trailing = api_grpc.status_of(ValueError("boom"), settings, "ModelInfer")
    assert code == grpc.StatusCode.INTERNAL
    assert "boom" not in message
    assert f"error id {dict(trailing)['x-error-id']}" in message


def test_the_server_commands_choose_the_grpc_port() -> None:
    assert chosen_grpc_port(Settings(), None) == 8001
    assert chosen_grpc_port(Settings(grpc_port=9001), None) == 9001
    assert chosen_grpc_port(Settings(grpc_port=0), None) == 0  # GRPC_PORT=0: off
    assert chosen_grpc_port(Settings(grpc_port=9001), 0) == 0
    assert api_grpc.address_of("::", 8001) == "[::]:8001"
    assert api_grpc.address_of("0.0.0.0", 8001) == "0.0.0.0:8001"
