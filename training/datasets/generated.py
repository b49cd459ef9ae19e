"""Datasets that need no files: scikit-learn's 8x8 digits and seeded synthetic noise."""

from __future__ import annotations

from importlib import metadata

import numpy as np
import torch
from torch import Tensor

from training.data import TensorSplit
from training.datasets.common import Parts, stratified_split, take
from training.datasets.digest import described
from training.specs import DigitsSpec, SyntheticSpec

# Std of the noise around each synthetic class's pattern, in uint8 steps.
NOISE_STD = 64.0
CHUNK = 1_024
DIGITS_SOURCE = "sklearn.datasets.load_digits"
SYNTHETIC_SOURCE = "generated"
# The spec fields that make a synthetic set's pixels and labels.
SYNTHETIC_FIELDS = ("num_classes", "image_size", "channels", "train_size", "test_size")


def digits(spec: DigitsSpec) -> Parts:
    """The 1,797 UCI digits, 0..16 scaled to 0..255, with a seeded stratified test split."""
    # scikit-learn takes a second to import: only what reads the digits pays for it.
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(bunch.images * 255 / 16).astype(np.uint8)[:, None]
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    everything = TensorSplit(torch.from_numpy(images), labels)
    kept, held = stratified_split(labels, spec.test_fraction, spec.split_seed)
    classes = tuple(str(digit) for digit in range(10))
    # The data is scikit-learn's copy: its version names it (the split, like any
    # dataset's, is no part of the digest).
    digest = described({"dataset": "digits", "scikit-learn": metadata.version("scikit-learn")})
    train, test = take(everything, kept), take(everything, held)
    return Parts("digits", classes, 1, (8, 8), train, test, digest, DIGITS_SOURCE)


def _noisy(patterns: Tensor, count: int, generator: torch.Generator) -> TensorSplit:
    """`count` images, each its class's pattern plus Gaussian noise, built in chunks."""
    labels = torch.randint(len(patterns), (count,), generator=generator)
    images = torch.empty((count, *patterns.shape[1:]), dtype=torch.uint8)
    for start in range(0, count, CHUNK):
        chunk = labels[start : start + CHUNK]
        noise = torch.randn((len(chunk), *patterns.shape[1:]), generator=generator) * NOISE_STD
        images[start : start + CHUNK] = (patterns[chunk] + noise).round().clamp(0, 255)
    return TensorSplit(images, labels)


def synthetic(spec: SyntheticSpec) -> Parts:
    """Seeded noise around one fixed random pattern per class, so a net can learn it."""
    generator = torch.Generator().manual_seed(spec.split_seed)
    shape = (spec.num_classes, spec.channels, spec.image_size, spec.image_size)
    patterns = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
    train = _noisy(patterns, spec.train_size, generator)
    test = _noisy(patterns, spec.test_size, generator)
    classes = tuple(f"class_{label}" for label in range(spec.num_classes))
    size = (spec.image_size, spec.image_size)
    return Parts(
        "synthetic",
        classes,
        spec.channels,
        size,
        train,
        test,
        _synthetic_digest(spec),
        SYNTHETIC_SOURCE,
    )


def _synthetic_digest(spec: SyntheticSpec) -> str:
    """The digest of a synthetic set: the fields and seed that draw it, and torch's version
    (whose generator draws it)."""
    fields = {name: getattr(spec, name) for name in SYNTHETIC_FIELDS}
    return described(
        {"dataset": "synthetic", **fields, "seed": spec.split_seed, "torch": torch.__version__}
    )
