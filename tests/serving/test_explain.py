"""Explanations called straight, without HTTP: the layer found in every family of the zoo,
Grad-CAM without parameter gradients, explain processes apart from the caller's, bounded
in number and in explanations at once."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import numpy as np
import pytest
import torch
from captum.attr import LayerGradCam
from prometheus_client import CollectorRegistry

from core.owners import Caller
from core.settings import Settings
from models.zoo import build
from serving.cache import ModelCache, RefCache
from serving.dataplane import DataPlane, Files
from serving.errors import OverloadedError
from serving.explain import Explainers, ExplainOptions, explain
from serving.files import Upload
from serving.metrics import ModelMetrics
from serving.process import ServingOptions
from tests import images
from tests.helpers import TINY, trained_job
from training import gradcam

T = TypeVar("T")
ANYONE = Caller(None, own_reads_only=False)


@pytest.mark.parametrize(
    ("name", "size", "layer", "features"),
    [
        ("resnet8", 32, "layer3", 8),  # CIFAR: 32, 16, 8
        ("plain8", 32, "layer3", 8),
        ("preact_resnet11", 32, "layer3", 8),  # bottleneck, full pre-activation
        ("resnet18", 64, "layer4", 2),  # ImageNet: /32
        ("plain18", 64, "layer4", 2),
    ],
)
def test_the_last_residual_stage_is_explained_in_every_family(
    name: str, size: int, layer: str, features: int
) -> None:
    net = gradcam.explainable(build(name, num_classes=5))
    x = torch.randn(2, 3, size, size)
    heatmaps = gradcam.grad_cam(net, x, [None, 3])
    assert heatmaps.layer == layer
    assert heatmaps.maps.shape == (2, features, features)
    assert heatmaps.upsampled.shape == (2, size, size)
    assert heatmaps.classes[1] == 3
    assert heatmaps.classes[0] == int(net(x).argmax(1)[0])
    assert 0 <= heatmaps.upsampled.min() <= heatmaps.upsampled.max() <= 1
    # Captum's own, on the same net and layer, scaled to its maximum.
    cam = LayerGradCam(net, getattr(net, layer)).attribute(
        x, target=heatmaps.classes, relu_attributions=True
    )
    cam = cam.detach()[:, 0].numpy()
    peaks = cam.max(axis=(1, 2), keepdims=True)
    expected = np.divide(cam, peaks, out=np.zeros_like(cam), where=peaks > 0)
    assert np.abs(heatmaps.maps - expected).max() < 1e-5
    assert all(p.grad is None and not p.requires_grad for p in net.parameters())
    assert not net.training


def test_an_overlay_is_the_colour_mapped_heatmap_over_the_image() -> None:
    grey = np.full((1, 6, 4), 100, dtype=np.uint8)
    hot = np.zeros((6, 4), dtype=np.float32)
    hot[0, 0] = 1.0
    overlay = np.asarray(gradcam.overlay(grey, hot), dtype=np.int16)
    assert overlay.shape == (6, 4, 3)
    # jet: 1 is dark red, 0 dark blue; blended half and half with the grey.
    assert overlay[0, 0, 0] > overlay[0, 0, 2]
    assert overlay[5, 3, 2] > overlay[5, 3, 0]


@pytest.fixture(scope="module")
def job(settings: Settings) -> uuid.UUID:
    """A succeeded train job (ResNet-8 on 8x8 RGB) with a best checkpoint in the store."""
    return trained_job(settings)


def with_explainers(
    settings: Settings,
    options: ExplainOptions,
    work: Callable[[DataPlane, Explainers], Awaitable[T]],
) -> T:
    """`work(plane, explainers)`, their processes stopped after."""

    async def run() -> T:
        cache = ModelCache(options=ServingOptions(threads=1))
        plane = DataPlane(settings, cache, RefCache(), ModelMetrics(CollectorRegistry()))
        explainers = Explainers(options)
        try:
            return await work(plane, explainers)
        finally:
            await explainers.close()
            await cache.close()

    return asyncio.run(run())


def plane_sha(plane: DataPlane, job: uuid.UUID) -> str:
    """The sha256 of the checkpoint a job id resolves to, as the plane resolved it."""
    kept = plane.refs.get(str(job), 60.0)
    assert kept is not None
    return kept.sha256


def files_of(*uploads: tuple[str, bytes]) -> Files:
    @asynccontextmanager
    async def read() -> AsyncIterator[list[Upload]]:
        yield [Upload(name, data, len(data)) for name, data in uploads]

    return read


def test_explanations_run_in_a_process_of_their_own_and_are_bounded(
    settings: Settings, job: uuid.UUID
) -> None:
    files = files_of(("red.png", images.flat_png((255, 0, 0))))

    async def work(plane: DataPlane, explainers: Explainers) -> None:
        explained = await explain(
            plane, explainers, str(job), ANYONE, files, wanted="1", overlays=True
        )
        assert explained.explained.heatmaps.classes == [1]
        assert explained.explained.overlays[0].startswith(b"\x89PNG")
        (process,) = explainers.entries.values()
        assert process.process.pid != os.getpid()
        assert not plane.models.entries  # no serving model was started for it
        # Two at once share the one process, started once.
        both = await asyncio.gather(
            *(
                explain(plane, explainers, str(job), ANYONE, files, wanted=None, overlays=False)
                for _ in range(2)
            )
        )
        assert [answer.explained.heatmaps.maps.shape for answer in both] == [(1, 2, 2)] * 2
        assert explainers.loads == 1
        assert explainers.running == 0
        # Every place taken: the next is refused at once, before its body is read.
        explainers.take()
        explainers.take()
        unread = files_of()  # would be refused for holding no file, were it read
        with pytest.raises(OverloadedError, match="2 explanations are running"):
            await explain(plane, explainers, str(job), ANYONE, unread, wanted=None, overlays=False)
        explainers.give_back()
        explainers.give_back()
        # Another checkpoint's process takes the only room: the first one's stops.
        await explain(plane, explainers, str(other), ANYONE, files, wanted=None, overlays=False)
        assert list(explainers.entries) == [plane_sha(plane, other)]
        if explainers.stopping:
            await asyncio.wait(set(explainers.stopping))
        assert process.process.poll() is not None

    # Another net (one more step): another checkpoint.
    recipe = {"iterations": 3, "batch_size": 16, "checkpoint_every": 1, "keep_last": 3}
    other = trained_job(settings, {**TINY, "recipe": recipe})
    options = ExplainOptions(max_models=1, max_running=2, threads=1)
    with_explainers(settings, options, work)
