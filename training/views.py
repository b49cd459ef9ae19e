"""Evaluation views: how many looks at each test image its scores average (2015 Sec. 3.4).

`center` is the declared preprocessing's one crop. `ten_crop` resizes the shorter side
(to the preprocessing's `resize`, or the input's 256/224 when it resizes to the input
itself) and takes the four corner and the centre crops and their mirrors (2015 Tables
2-4). `multi_scale` is the fully convolutional test: the whole image with its shorter side
at each of the paper's scales {224, 256, 384, 480, 640} (scaled to the input), and its
mirror; the net's global pooling makes it fully convolutional. Softmax scores are averaged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Literal, get_args

import torch
from PIL import Image
from torch import Tensor, nn
from torchvision.transforms.v2 import functional as TF

from training.data import FileSplit, Split
from training.datasets.images import normalised, open_image
from training.evaluate import Evaluation, accumulate, predict_logits, summarise
from training.pipeline import Normalise
from training.preprocess import Preprocessing

View = Literal["center", "ten_crop", "multi_scale"]
VIEWS: tuple[View, ...] = get_args(View)
PAPER_SCALES = (224, 256, 384, 480, 640)  # 2015 Table 5's shorter sides
TEN_CROP_RESIZE = 256 / 224  # torchvision's, and the paper's, resize per unit of crop
# Looks' pixels (uint8 values) per forward: 32 ImageNet crops, or thousands of CIFAR ones.
LOOK_PIXELS = 32 * 3 * 224 * 224


def ten_crop_resize(preprocessing: Preprocessing) -> int:
    """The shorter side the ten crops are taken from."""
    short = min(preprocessing.crop)
    if preprocessing.resize is not None and preprocessing.resize > short:
        return preprocessing.resize
    return round(short * TEN_CROP_RESIZE)


def scales(preprocessing: Preprocessing) -> list[int]:
    """The shorter sides of the multi-scale test: the paper's, per 224 pixels of input."""
    short = min(preprocessing.crop)
    return [round(scale * short / 224) for scale in PAPER_SCALES]


def looks(image: Image.Image, preprocessing: Preprocessing, view: View) -> Iterator[Tensor]:
    """An image's looks as uint8 batches (N, C, H, W): one batch per size."""
    if view == "center":
        yield torch.from_numpy(preprocessing.image(image))[None]
        return
    upright = normalised(image, preprocessing.channels)
    if view == "ten_crop":
        yield torch.stack(
            TF.ten_crop(
                _resized(upright, preprocessing, ten_crop_resize(preprocessing)),
                list(preprocessing.crop),
            )
        )
        return
    for side in scales(preprocessing):
        resized = _resized(upright, preprocessing, side)
        yield torch.stack([resized, resized.flip(2)])


def _resized(image: Image.Image, preprocessing: Preprocessing, side: int) -> Tensor:
    """The image with its shorter side at `side` as uint8 (C, H, W), resized by Pillow as
    the declared preprocessing resizes (so the ten crops' centre is its crop exactly)."""
    resized: Image.Image = TF.resize(image, [side], preprocessing.mode, antialias=True)
    tensor: Tensor = TF.pil_to_tensor(resized)
    return tensor


def pil_images(split: Split) -> Iterator[tuple[Image.Image, int]]:
    """A split's images as Pillow images with their labels: files as decoded, arrays as
    stored (at the input size: their looks are of that image)."""
    labels = split.labels.tolist()
    if isinstance(split, FileSplit):
        for path, label in zip(split.paths, labels, strict=True):
            with open_image(path) as image:
                image.load()
                yield image, label
        return
    for pixels, label in zip(split.images, labels, strict=True):
        array = pixels.permute(1, 2, 0).numpy()
        yield Image.fromarray(array[..., 0] if array.shape[2] == 1 else array), label


@torch.no_grad()
def evaluate_views(
    model: nn.Module,
    split: Split,
    preprocessing: Preprocessing,
    view: View,
    *,
    num_classes: int,
    device: torch.device,
    tta_flip: bool = False,
) -> Evaluation:
    """Evaluate `model` on every image of `split`, each scored by the mean softmax of its
    looks (with `tta_flip`, the centre view's mirror too)."""
    was_training = model.training
    model.eval()
    normalise = Normalise(preprocessing, device, channels_last=False)
    sums: dict[str, Tensor] = {}
    started = time.perf_counter()

    def forward(batch: Tensor) -> Tensor:
        return predict_logits(model, normalise(batch.to(device)), tta_flip=tta_flip).softmax(1)

    for group in _groups(split, preprocessing, view):
        mean = mean_of_looks(forward, [batches for batches, _ in group])
        labels = torch.tensor([label for _, label in group], device=device)
        # Log-probabilities as logits: their softmax is the mean, their loss its -log p.
        accumulate(sums, mean.clamp(min=1e-12).log(), labels, num_classes)
    model.train(was_training)
    if not sums:
        raise ValueError("cannot evaluate on an empty split")
    elapsed = time.perf_counter() - started
    return summarise({k: v.cpu() for k, v in sums.items()}, num_classes, elapsed)


Looked = tuple[list[Tensor], int]  # an image's looks (uint8 batches) and its label


def _groups(split: Split, preprocessing: Preprocessing, view: View) -> Iterator[list[Looked]]:
    """The split's images with their looks, in groups of at most LOOK_PIXELS of looks (at
    least one image), so that each look size is one forward per group, not per image."""
    group: list[Looked] = []
    pixels = 0
    for image, label in pil_images(split):
        batches = list(looks(image, preprocessing, view))
        size = sum(batch.numel() for batch in batches)
        if group and pixels + size > LOOK_PIXELS:
            yield group
            group, pixels = [], 0
        group.append((batches, label))
        pixels += size
    if group:
        yield group


def mean_of_looks(forward: Callable[[Tensor], Tensor], images: list[list[Tensor]]) -> Tensor:
    """Each image's mean probabilities over its looks, (N, classes): looks of one size are
    stacked across the images into one batch for `forward`."""
    by_size: dict[tuple[int, ...], list[tuple[int, Tensor]]] = {}
    for index, batches in enumerate(images):
        for batch in batches:
            by_size.setdefault(tuple(batch.shape[1:]), []).append((index, batch))
    total: Tensor | None = None
    counts = torch.zeros(len(images))
    for entries in by_size.values():
        probabilities = forward(torch.cat([batch for _, batch in entries]))
        owners = torch.cat([torch.full((len(batch),), index) for index, batch in entries])
        if total is None:
            total = probabilities.new_zeros(len(images), probabilities.shape[1])
        total.index_add_(0, owners.to(total.device), probabilities)
        counts.index_add_(0, owners, torch.ones(len(owners)))
    assert total is not None, "every image has at least one look"
    return total / counts.to(total.device)[:, None]
