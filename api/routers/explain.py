"""Explanations: the Grad-CAM of a prediction, as arrays (JSON) or as a PNG overlay.

The same model references, bodies (a multipart form of `files`, or one raw image), image
checks and preprocessing as `POST /api/v1/predict`; the route parses its query, makes one
call of `serving.explain.explain` and renders its answer. The Grad-CAM is computed in an
explain process of the checkpoint's own (the event loop only awaits it).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import quote

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic_core import to_json

from api.errors import responses
from api.hot_routes import caller_of, plane_of, query_of
from api.routers import predict
from api.schemas import API_PREFIX, ExplainOut
from core.errors import InvalidError
from core.settings import Settings
from serving.explain import Explainers, Explanation, explain
from serving.files import Upload

router = APIRouter(prefix="/explain", tags=["predict"])
PATH = API_PREFIX + router.prefix
FORMATS = ("json", "png")
DIGITS = 4  # decimals of a heatmap's values in JSON


def body_limit(settings: Settings) -> int:
    """The request body limit of the explain route: every file at its limit, plus framing."""
    most = settings.explain_max_images * settings.predict_max_image_bytes
    return most + predict.MULTIPART_OVERHEAD


_OPENAPI = {
    "parameters": [
        {
            "name": "model",
            "in": "query",
            "required": True,
            "schema": {"type": "string", "minLength": 1, "maxLength": predict.MAX_REF},
            "description": "A job id, `name` (latest version), `name/3` or `name@alias`.",
        },
        {
            "name": "class",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "default": "top"},
            "description": "The class explained: `top` (each image's top class), a class "
            "name or an index.",
        },
        {
            "name": "format",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "enum": list(FORMATS), "default": "json"},
            "description": "json: the heatmaps as arrays; png: one image's overlay.",
        },
    ],
    "requestBody": predict._OPENAPI["requestBody"],
}


@router.post(
    "",
    summary="Explain a prediction (Grad-CAM)",
    response_model=ExplainOut,
    responses={
        **responses(400, 401, 403, 404, 409, 413, 415, 422, 503),
        200: {"content": {"image/png": {}}, "description": "The overlay, with format=png."},
    },
    openapi_extra=_OPENAPI,
)
async def explain_images(request: Request) -> Response:
    """The Grad-CAM of each file on the net's last residual stage, for its top class or
    the class named (`class`).

    With `format=json` (the default): per file, the class explained and its probability,
    and the heatmap in 0..1 at the layer's resolution and upsampled to the net's input.
    With `format=png` (one file): the heatmap colour-mapped and blended over the image as
    the net saw it, at the net's input size; the `X-Explained-*` headers name the class
    (its label percent-encoded), its probability and the layer.

    Refusals: an unknown class is a 422 listing the valid ones; more than
    EXPLAIN_MAX_IMAGES files a 413; any bad file the request's refusal, as a prediction's
    (400/413/415); an unknown model or one the caller may not read a 404; a full house of
    explanations a 503 with Retry-After.
    """
    caller = caller_of(request, "predict")
    model, wanted, form = _query(request)
    plane = plane_of(request)
    explainers: Explainers = request.scope["state"]["explainers"]
    settings = plane.settings
    files = _one_file if form == "png" else _body_files
    explanation = await explain(
        plane,
        explainers,
        model,
        caller,
        lambda: files(request, settings),
        wanted=wanted,
        overlays=form == "png",
    )
    if form == "png":
        return _png(explanation)
    return Response(to_json(_answer(explanation)), media_type="application/json")


def _query(request: Request) -> tuple[str, str | None, str]:
    """The `model`, `class` and `format` query parameters, or a 422 naming the wrong one."""
    query = query_of(request.scope["query_string"])
    model = query.get("model")
    if model is None:
        raise InvalidError("model: Field required", field=("query", "model"))
    if not 1 <= len(model) <= predict.MAX_REF:
        raise InvalidError(
            f"model: String should have 1 to {predict.MAX_REF} characters",
            field=("query", "model"),
        )
    form = query.get("format", "json")
    if form not in FORMATS:
        raise InvalidError(
            f"format: {form!r} is not one of {', '.join(FORMATS)}", field=("query", "format")
        )
    return model, query.get("class"), form


def _body_files(request: Request, settings: Settings) -> AbstractAsyncContextManager[list[Upload]]:
    """The body's files, read as the predict route reads them (with its limits)."""
    return predict._FilesOf(request, settings)


@asynccontextmanager
async def _one_file(request: Request, settings: Settings) -> AsyncIterator[list[Upload]]:
    """The body's files, which must be one: a PNG overlay answers one image."""
    async with _body_files(request, settings) as uploads:
        if len(uploads) != 1:
            raise InvalidError(
                f"format=png answers one image, and {len(uploads)} files were sent; send "
                "one file, or ask for format=json",
                field=("query", "format"),
            )
        yield uploads


def _answer(explanation: Explanation) -> dict[str, Any]:
    """The JSON answer (an ExplainOut)."""
    heatmaps, classes = explanation.explained.heatmaps, explanation.info.classes
    results = []
    for index, file in enumerate(explanation.files):
        label = heatmaps.classes[index]
        results.append(
            {
                "file": file.name,
                "resize": file.resize,
                "explained": {
                    "label": classes[label],
                    "index": label,
                    "probability": heatmaps.probabilities[index],
                },
                "heatmap": np.round(heatmaps.maps[index], DIGITS).tolist(),
                "upsampled": np.round(heatmaps.upsampled[index], DIGITS).tolist(),
            }
        )
    return {
        "model": predict._served_model(explanation.target),
        "preprocessing": predict._preprocessing(explanation.preprocessing),
        "layer": heatmaps.layer,
        "results": results,
        "timing": {
            "explain_ms": explanation.explain_s * 1000,
            "total_ms": (time.perf_counter() - explanation.started) * 1000,
        },
    }


def _png(explanation: Explanation) -> Response:
    """The one file's overlay, its class, probability and layer in headers."""
    heatmaps = explanation.explained.heatmaps
    label = heatmaps.classes[0]
    headers = {
        "X-Explained-Class": quote(explanation.info.classes[label]),
        "X-Explained-Index": str(label),
        "X-Explained-Probability": f"{heatmaps.probabilities[0]:.6g}",
        "X-Explained-Layer": heatmaps.layer,
    }
    return Response(explanation.explained.overlays[0], media_type="image/png", headers=headers)
