"""Grad-CAM (Selvaraju et al. 2017) of a trained net, by Captum: where the net looked.

The layer explained is the net's last residual stage (found by structure: the last
sequence of residual units, for CIFAR, ImageNet, pre-activation and plain nets alike),
whose maps are the finest that still see the whole image. Captum's `LayerGradCam` weighs
each of its channels by the class score's mean gradient and keeps the positive part; the
map is scaled to 0..1 by its own maximum and upsampled to the input by
`LayerAttribution.interpolate`. An overlay is that map colour-mapped and blended over the
image as the net saw it (after its resize and crop).

Only the layer's activations need gradients: the net's parameters are frozen once
(`explainable`), so no parameter gradient is ever computed or kept.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from captum.attr import LayerAttribution, LayerGradCam
from matplotlib import colormaps
from PIL import Image
from torch import Tensor, nn

from models.blocks import ResidualUnit

COLOUR_MAP = "jet"
ALPHA = 0.5  # the heatmap's weight in an overlay


@dataclass(frozen=True)
class Heatmaps:
    """A batch's Grad-CAM: the class explained per image, its probability, the map at the
    layer's resolution and upsampled to the input (both 0..1), and the layer's name."""

    classes: list[int]
    probabilities: list[float]
    maps: npt.NDArray[np.float32]  # (N, h, w)
    upsampled: npt.NDArray[np.float32]  # (N, H, W)
    layer: str


def last_stage(model: nn.Module) -> tuple[str, nn.Module]:
    """The name and module of the net's last residual stage: its last `nn.Sequential` of
    residual units (plain units included)."""
    stages = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Sequential)
        and len(module) > 0
        and all(isinstance(unit, ResidualUnit) for unit in module)
    ]
    if not stages:
        raise ValueError("the net has no stage of residual units to explain")
    return stages[-1]


def explainable(model: nn.Module) -> nn.Module:
    """The net in eval mode with its parameters frozen: Grad-CAM then takes gradients
    with respect to the layer's activations only."""
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def grad_cam(model: nn.Module, x: Tensor, classes: list[int | None]) -> Heatmaps:
    """The Grad-CAM of each normalised image of `x` for its class (None: its top class),
    on the net's last residual stage; `model` should be `explainable`."""
    name, layer = last_stage(model)
    with torch.no_grad():
        probabilities = model(x).softmax(1)
    top = probabilities.argmax(1).tolist()
    targets = [top[i] if wanted is None else wanted for i, wanted in enumerate(classes)]
    target = torch.tensor(targets, device=x.device)
    cam = LayerGradCam(model, layer).attribute(x, target=target, relu_attributions=True)
    cam = cam.detach()
    # Each map over its own maximum: bilinear upsampling stays within it, so both are 0..1.
    peak = cam.amax(dim=(1, 2, 3), keepdim=True).clamp_min(torch.finfo(cam.dtype).tiny)
    cam = cam / peak
    upsampled = LayerAttribution.interpolate(cam, tuple(x.shape[-2:]), "bilinear")
    chosen = probabilities[torch.arange(len(targets)), target]
    return Heatmaps(
        targets,
        chosen.tolist(),
        cam[:, 0].cpu().numpy(),
        upsampled[:, 0].clamp(0, 1).cpu().numpy(),
        name,
    )


def overlay(image: npt.NDArray[np.uint8], heatmap: npt.NDArray[np.float32]) -> Image.Image:
    """The heatmap (H, W, 0..1) colour-mapped and blended over the uint8 (C, H, W) image."""
    base = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
    rgb = Image.fromarray(np.ascontiguousarray(base)).convert("RGB")
    colours = colormaps[COLOUR_MAP](np.clip(heatmap, 0, 1))[..., :3]
    heat = Image.fromarray((colours * 255).round().astype(np.uint8), mode="RGB")
    return Image.blend(rgb, heat, ALPHA)


def png(image: Image.Image) -> bytes:
    """The image as PNG bytes."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
