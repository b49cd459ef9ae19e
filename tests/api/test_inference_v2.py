"""The Open Inference Protocol (KServe v2) at /v2, driven by Triton's own HTTP client
against the API served by uvicorn, beside /api/v1/predict: health, metadata, infer in
JSON and binary form, encoded files, the classification extension, aliases, the
protocol's error shape; the raw image body of /api/v1/predict; the per-model metrics.

A tiny ResNet-8 (8x8 RGB synthetic data, two training steps) is registered as `tiny`.
"""

from __future__ import annotations

import asyncio
import base64
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from PIL import Image
from starlette.types import Message, Receive, Scope, Send
from tritonclient.utils import InferenceServerException

from api.limits import BodyLimit, PredictShed
from api.routers import inference
from client.api import Client
from core import model_registry
from core.settings import Settings
from serving.cache import ModelCache, RefCache
from serving.process import ServingOptions
from tests import images
from tests.helpers import make_key, trained_job

PREDICT = "/api/v1/predict"
SIZE = 8  # the tiny net's input: 8x8 RGB (tests.helpers.TINY)


@pytest.fixture(scope="module")
def keys(settings: Settings) -> dict[str, str]:
    """A predict + read key, and a read-only key, as headers."""
    return {
        scope: f"Bearer {make_key(settings.database_url, *scopes)}"
        for scope, scopes in (("predict", ("predict", "read", "train")), ("read", ("read",)))
    }


@pytest.fixture(scope="module")
def tiny(live_url: str, settings: Settings, keys: dict[str, str]) -> uuid.UUID:
    """`tiny` version 1, aliased `production`: a trained job's best checkpoint."""
    job_id = trained_job(settings)
    auth = {"Authorization": keys["predict"]}
    with httpx.Client(base_url=f"{live_url}/api/v1", headers=auth, timeout=60) as http:
        added = http.post("/registry/tiny/versions", json={"job": str(job_id)})
        assert added.status_code == 201, added.text
        moved = http.put("/registry/tiny/aliases/production", json={"version": 1})
        assert moved.status_code == 200, moved.text
    return job_id


@pytest.fixture(scope="module")
def client(live_url: str) -> Iterator[triton.InferenceServerClient]:
    """Triton's HTTP client of the served API."""
    server = triton.InferenceServerClient(url=live_url.removeprefix("http://"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def http(live_url: str) -> Iterator[httpx.Client]:
    """A plain HTTP client of the served API."""
    with httpx.Client(base_url=live_url, timeout=60) as plain:
        yield plain


def pixels(count: int) -> np.ndarray:
    """`count` 8x8 RGB images, uint8 [N, H, W, C]."""
    return np.random.default_rng(count).integers(0, 256, (count, SIZE, SIZE, 3), dtype=np.uint8)


def png(array: np.ndarray) -> bytes:
    """An [H, W, C] image as PNG bytes."""
    return images.encode(Image.fromarray(array, mode="RGB"))


def uint8_input(array: np.ndarray, *, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput("INPUT", list(array.shape), "UINT8")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def bytes_input(files: list[bytes]) -> triton.InferInput:
    tensor = triton.InferInput("IMAGE_BYTES", [len(files)], "BYTES")
    tensor.set_data_from_numpy(np.array(files, dtype=np.object_), binary_data=True)
    return tensor


def predicted(
    http: httpx.Client, key: str, files: list[bytes], model: str = "tiny"
) -> list[dict[str, Any]]:
    """/api/v1/predict's results for PNG files, every class."""
    answer = http.post(
        PREDICT,
        params={"model": model, "top_k": 1000},
        files=[("files", (f"{i}.png", data, "image/png")) for i, data in enumerate(files)],
        headers={"Authorization": key},
    )
    assert answer.status_code == 200, answer.text
    results: list[dict[str, Any]] = answer.json()["results"]
    return results


def as_rows(results: list[dict[str, Any]], classes: int) -> np.ndarray:
    """Per result, its probabilities by class index."""
    rows = np.zeros((len(results), classes), dtype=np.float64)
    for row, result in zip(rows, results, strict=True):
        for entry in result["top_k"]:
            row[entry["index"]] = entry["probability"]
    return rows


def test_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "resnet-service"
    assert set(metadata["extensions"]) >= {"classification", "binary_tensor_data"}


def test_model_metadata_and_readiness(
    client: triton.InferenceServerClient, keys: dict[str, str], tiny: uuid.UUID
) -> None:
    auth = {"Authorization": keys["read"]}
    metadata = client.get_model_metadata("tiny@production", headers=auth)
    assert metadata["name"] == "tiny@production"
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "pytorch"
    inputs = {tensor["name"]: tensor for tensor in metadata["inputs"]}
    assert (inputs["INPUT"]["datatype"], inputs["INPUT"]["shape"]) == ("UINT8", [-1, 8, 8, 3])
    assert (inputs["IMAGE_BYTES"]["datatype"], inputs["IMAGE_BYTES"]["shape"]) == ("BYTES", [-1])
    (output,) = metadata["outputs"]
    assert (output["name"], output["datatype"], output["shape"][0]) == ("PROBABILITIES", "FP32", -1)
    assert client.get_model_metadata("tiny", "1", headers=auth)["versions"] == ["1"]
    assert client.is_model_ready("tiny@production", headers=auth)
    assert client.is_model_ready(str(tiny), headers=auth)  # a job id
    assert not client.is_model_ready("tiny", "7", headers=auth)
    assert not client.is_model_ready("nobody", headers=auth)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_uint8_infer_equals_predict(
    client: triton.InferenceServerClient,
    http: httpx.Client,
    keys: dict[str, str],
    tiny: uuid.UUID,
    binary: bool,
) -> None:
    array = pixels(3)
    wanted = triton.InferRequestedOutput("PROBABILITIES", binary_data=binary)
    result = client.infer(
        "tiny@production",
        [uint8_input(array, binary=binary)],
        outputs=[wanted],
        request_id="req-1",
        headers={"Authorization": keys["predict"]},
    )
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == (
        "tiny",
        "1",
        "req-1",
    )
    probabilities = result.as_numpy("PROBABILITIES")
    assert probabilities.dtype == np.float32
    assert probabilities.shape[0] == 3
    assert np.allclose(probabilities.sum(axis=1), 1, atol=1e-5)
    results = predicted(http, keys["predict"], [png(a) for a in array])
    expected = as_rows(results, probabilities.shape[1])
    np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-6)


def test_encoded_files_with_a_version_and_the_classification_extension(
    client: triton.InferenceServerClient, http: httpx.Client, keys: dict[str, str], tiny: uuid.UUID
) -> None:
    files = [png(a) for a in pixels(2)]
    auth = {"Authorization": keys["predict"]}
    result = client.infer("tiny", [bytes_input(files)], model_version="1", headers=auth)
    probabilities = result.as_numpy("PROBABILITIES")
    expected = as_rows(predicted(http, keys["predict"], files), probabilities.shape[1])
    np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-6)

    for binary in (False, True):
        top = triton.InferRequestedOutput("PROBABILITIES", binary_data=binary, class_count=3)
        classes = client.infer(str(tiny), [bytes_input(files)], outputs=[top], headers=auth)
        labels = classes.as_numpy("PROBABILITIES")
        assert labels.shape == (2, 3)
        for row, best in zip(labels, expected, strict=True):
            # JSON data comes back as str, binary data as bytes.
            parsed = [(e.decode() if isinstance(e, bytes) else e).split(":") for e in row]
            assert [int(index) for _, index, _ in parsed] == list(np.argsort(-best)[:3])
            assert [label for _, _, label in parsed] == [f"class_{i}" for _, i, _ in parsed]
            assert float(parsed[0][0]) == pytest.approx(best.max(), abs=1e-6)


def _error(answer: httpx.Response, status: int, fragment: str) -> None:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"], str)
    assert fragment in body["error"], body


def _infer_json(inputs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"inputs": inputs}


def test_errors_have_the_protocol_shape(
    http: httpx.Client, keys: dict[str, str], tiny: uuid.UUID
) -> None:
    auth = {"Authorization": keys["predict"]}
    good = {"name": "INPUT", "shape": [1, 8, 8, 3], "datatype": "UINT8", "data": [0] * 192}
    url = "/v2/models/tiny/infer"
    unknown = http.post("/v2/models/nobody/infer", json=_infer_json([good]), headers=auth)
    _error(unknown, 404, "model 'nobody' is not registered")
    _error(http.post(url, json=_infer_json([good])), 401, "API key is required")
    reader = {"Authorization": keys["read"]}
    _error(http.post(url, json=_infer_json([good]), headers=reader), 403, "'predict' scope")
    wrong = {**good, "shape": [1, 4, 4, 3], "data": [0] * 48}
    _error(http.post(url, json=_infer_json([wrong]), headers=auth), 400, "does not fit")
    _error(http.post(url, content=b"{", headers=auth), 400, "malformed")
    text = {"name": "IMAGE_BYTES", "shape": [1], "datatype": "BYTES", "data": ["aGVsbG8="]}
    _error(http.post(url, json=_infer_json([text]), headers=auth), 415, "not an image")
    truncated = images.encode(Image.new("RGB", (64, 64), 3))[:60]
    cut = {**text, "data": [base64.b64encode(truncated).decode()]}
    _error(http.post(url, json=_infer_json([cut]), headers=auth), 400, "IMAGE_BYTES[0]")
    many = {**good, "shape": [17, 8, 8, 3], "data": [0] * 192 * 17}
    _error(http.post(url, json=_infer_json([many]), headers=auth), 413, "over the limit")
    _error(http.post("/v2/models/tiny/versions/x/infer", json={}, headers=auth), 400, "version")
    # Metadata needs a key with the read scope (the predict key holds it too).
    _error(http.get("/v2/models/tiny"), 401, "API key is required")
    assert http.get("/v2/models/tiny", headers=auth).status_code == 200


def test_a_raw_image_body_is_answered_as_a_multipart_file(
    http: httpx.Client, live_url: str, keys: dict[str, str], tiny: uuid.UUID
) -> None:
    data = png(pixels(1)[0])
    auth = {"Authorization": keys["predict"]}
    raw = http.post(
        PREDICT,
        params={"model": "tiny@production", "top_k": 3},
        content=data,
        headers=auth | {"Content-Type": "image/png"},
    )
    assert raw.status_code == 200, raw.text
    body = raw.json()
    (result,) = body["results"]
    assert (result["file"], result["resize"], result["error"]) == ("image", "none", None)
    assert len(result["top_k"]) == 3
    assert body["model"]["version"] == 1
    multipart = predicted(http, keys["predict"], [data], model="tiny@production")[0]
    assert [t["index"] for t in result["top_k"]] == [t["index"] for t in multipart["top_k"][:3]]
    with Client(live_url, keys["predict"].removeprefix("Bearer "), timeout=60) as service:
        sent = service.predict(data, "tiny@production", top_k=3, raw=True)
    assert sent["results"] == body["results"]
    bad = http.post(
        PREDICT,
        params={"model": "tiny"},
        content=b"not an image",
        headers=auth | {"Content-Type": "image/jpeg"},
    )
    assert bad.status_code == 415, bad.text
    assert "image: not an image" in bad.json()["error"]["message"]


def _series(metrics: str, name: str, **labels: str) -> float:
    """The value of one series of the Prometheus text (0 when absent)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in labels.items())
    pattern = rf"^{re.escape(name)}\{{{re.escape(wanted)}\}} (\S+)$"
    found = re.search(pattern, metrics, re.MULTILINE)
    return float(found[1]) if found else 0.0


def test_per_model_metrics(
    client: triton.InferenceServerClient, http: httpx.Client, keys: dict[str, str], tiny: uuid.UUID
) -> None:
    auth = {"Authorization": keys["predict"]}
    before = http.get("/api/v1/metrics").text
    for _ in range(3):
        predicted(http, keys["predict"], [png(pixels(1)[0])], model="tiny@production")
        client.infer("tiny", [uint8_input(pixels(2), binary=True)], headers=auth)
    with pytest.raises(InferenceServerException):
        client.infer("tiny", [uint8_input(pixels(1)[:, :4], binary=True)], headers=auth)
    after = http.get("/api/v1/metrics").text
    label = {"model": "tiny/1"}

    def grew(name: str, **more: str) -> float:
        return _series(after, name, **label, **more) - _series(before, name, **label, **more)

    assert grew("resnet_model_images_total") == 3 * 1 + 3 * 2
    assert grew("resnet_model_request_duration_seconds_count") == 7
    assert grew("resnet_model_queue_duration_seconds_count") == 6
    assert grew("resnet_model_inference_duration_seconds_count") == 6
    assert 1 <= grew("resnet_model_batch_size_count") <= 6
    assert grew("resnet_model_batch_size_sum") == 9
    assert grew("resnet_model_errors_total", status="400") == 1
    assert _series(after, "resnet_model_inference_duration_seconds_sum", **label) > 0
    # A reference as sent is no label: only the resolved target is.
    assert 'model="tiny@production"' not in after


def test_infer_paths_are_sized_and_shed_as_the_predict_route() -> None:
    """An infer path has the prediction body limit and is refused early when its model's
    queue is full, as /api/v1/predict is."""
    settings = Settings()
    limits = BodyLimit(
        _no_route, 1, {}, by_test=((inference.is_infer, inference.body_limit(settings)),)
    )
    assert limits.limit("/v2/models/tiny@production/infer") == inference.body_limit(settings)
    assert limits.limit("/v2/models/tiny/versions/2/infer") == inference.body_limit(settings)
    assert limits.limit("/v2/models/tiny") == 1
    assert inference.infer_ref("/v2/models/tiny/versions/2/infer") == "tiny/2"
    assert inference.infer_ref("/v2/models/tiny@production/infer") == "tiny@production"
    assert inference.infer_ref("/v2/models/tiny/versions/x/infer") is None
    assert inference.infer_ref("/api/v1/predict") is None

    target = model_registry.Resolved("m/1", uuid.uuid4(), "m", 1, "/x.pt", "0" * 64, 1)
    refs, cache = RefCache(), ModelCache(options=ServingOptions(max_queue=1, threads=1))
    refs.put("m/1", target, refs.generation)
    cache.admit(target.sha256)  # full
    shed = PredictShed(_no_route, "/api/v1/predict", 60, False, ref_of=inference.infer_ref)

    def status(path: str) -> int:
        answered: list[int] = []

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                answered.append(message["status"])

        scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "query_string": b"",
            "headers": [],
            "state": {"model_cache": cache, "refs": refs},
        }
        asyncio.run(shed(scope, _disconnect, send))
        return answered[0] if answered else 0

    assert status("/v2/models/m/versions/1/infer") == 503
    assert status("/v2/models/m/infer") == 0  # not resolved yet: the route resolves it


async def _no_route(_scope: Scope, _receive: Receive, _send: Send) -> None:
    return None


async def _disconnect() -> Message:
    return {"type": "http.disconnect"}
