"""Classifying images with a trained checkpoint, preprocessed exactly as training was.

Untrusted image bytes are checked before they are decoded: an allowed format, a pixel
limit read from the header (a decompression bomb is refused without decoding), and a
complete file. A checked image becomes input through the checkpoint's declared
preprocessing (`training.preprocess`) and is normalised by the same code as the training
pipeline, so a training image classifies exactly as the evaluation engine scores it.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.fx.experimental.optimization as fx_optimization
from PIL import Image, UnidentifiedImageError
from torch import Tensor, nn

from models.zoo import TRACING
from training.evaluate import predict_logits
from training.pipeline import Normalise
from training.preprocess import Preprocessing
from training.runs import load_trained_model

ALLOWED_FORMATS = frozenset({"PNG", "JPEG", "WEBP", "BMP"})
DEFAULT_MAX_PIXELS = 40_000_000
Precision = Literal["fp32", "bf16", "fp16"]
DTYPES: dict[Precision, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
# A reduced precision's probabilities may differ from fp32's by rounding: bf16 keeps 8 bits
# of mantissa, so a probability moves by about 1e-2 (ResNet-8 on digits: under 1e-2 in bf16,
# 1e-3 in fp16); a net whose activations overflow fp16 moves them by far more.
DEFAULT_PRECISION_TOLERANCE = 0.05
PROBE_BATCH = 16  # seeded images of the check of a reduced precision, the same every start
PROBE_SEED = 0


class PrecisionMismatchError(ValueError):
    """A net cast to a reduced precision answers too far from its fp32 probabilities."""


class ImageRejectedError(ValueError):
    """An uploaded file that is not a usable image: one of the three kinds below."""


class UndecodableImageError(ImageRejectedError):
    """The file is empty, truncated or its pixels cannot be decoded."""


class ImageTooLargeError(ImageRejectedError):
    """The image is over a byte or pixel limit."""


class UnsupportedImageError(ImageRejectedError):
    """The file is not an image in an allowed format."""


def open_checked(
    data: bytes, name: str, *, max_pixels: int = DEFAULT_MAX_PIXELS, load: bool = True
) -> Image.Image:
    """Open and check an uploaded image, or raise `ImageRejectedError`.

    The format and the pixel count are checked from the header; then the pixels are decoded
    (which finds a truncated file) unless `load` is false: `load_checked` does it later.
    """
    if not data:
        raise UndecodableImageError(f"{name}: the file is empty")
    try:
        with warnings.catch_warnings():
            # Pillow warns before its own bomb limit; our limit is checked just below.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        raise ImageTooLargeError(f"{name}: over the limit of {max_pixels:,} pixels") from None
    except UnidentifiedImageError:  # its message names a buffer's address, not the file
        raise UnsupportedImageError(f"{name}: not an image in a supported format") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise UnsupportedImageError(
            f"{name}: not an image in a supported format ({error})"
        ) from None
    if image.format not in ALLOWED_FORMATS:
        allowed = ", ".join(sorted(ALLOWED_FORMATS))
        raise UnsupportedImageError(f"{name}: format {image.format} is not allowed; use {allowed}")
    width, height = image.size
    if width * height > max_pixels:
        raise ImageTooLargeError(
            f"{name}: {width}x{height} pixels is over the limit of {max_pixels:,}"
        )
    return load_checked(image, name) if load else image


def load_checked(image: Image.Image, name: str) -> Image.Image:
    """Decode the pixels of an image `open_checked` let through, or raise a 400."""
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as error:
        raise UndecodableImageError(
            f"{name}: the image is truncated or corrupt ({error})"
        ) from None
    return image


def fit_to(image: Image.Image, preprocessing: Preprocessing) -> tuple[np.ndarray, str]:
    """The image as the checkpoint's uint8 (C, H, W) input, by its declared preprocessing,
    and what that did to it ("none", "resize" or "resize+center-crop")."""
    return preprocessing.image(image), preprocessing.describe(image)


@dataclass(frozen=True)
class Classification:
    """One image's top-k answer."""

    indices: list[int]
    labels: list[str]
    probabilities: list[float]


def serving_form(model: nn.Module) -> nn.Module:
    """The eval-mode net with each batch norm that follows a convolution folded into it,
    in channels_last: the same function up to float rounding, in fewer, faster kernels.

    ResNet-20 on one thread at batch 32: 1.6x the eager net's images/s here
    (`python -m bench.serving_form`).
    Probabilities differ from the eager net's by under 1e-6 (tests/training/test_predictor).
    A pre-activation unit's batch norms precede their convolutions and stay.
    """
    with TRACING:  # torch.fx patches module calls process-wide while it traces
        folded = fx_optimization.fuse(model)  # copies the net
    return folded.to(memory_format=torch.channels_last)


class Predictor:
    """A checkpoint's net in eval mode, with its preprocessing; thread-compatible for reads.

    With `fold`, it runs the net's `serving_form`: probabilities equal to the evaluation
    engine's up to float rounding instead of bit for bit. With a `precision` other than
    fp32 the net's weights are cast to it (images are normalised in fp32, then cast; the
    softmax runs in fp32), once its probabilities on a seeded probe batch are within
    `tolerance` of the fp32 net's (`PrecisionMismatchError` otherwise).
    """

    def __init__(
        self,
        path: Path,
        *,
        sha256: str,
        device: torch.device | None = None,
        fold: bool = False,
        precision: Precision = "fp32",
        tolerance: float = DEFAULT_PRECISION_TOLERANCE,
    ) -> None:
        self.device = device or torch.device("cpu")
        trained = load_trained_model(path, sha256=sha256, device=self.device)
        self.info, self.spec, self.preprocessing = trained.info, trained.spec, trained.preprocessing
        self.model: nn.Module = serving_form(trained.model) if fold else trained.model
        self.sha256 = sha256
        self.normalise = Normalise(self.preprocessing, self.device, channels_last=fold)
        self.precision, self.dtype = precision, DTYPES[precision]
        self.precision_diff = 0.0  # max |p - p_fp32| on the probe batch
        if precision != "fp32":
            self.precision_diff = self._cast(tolerance)
        self.bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())

    @torch.inference_mode()
    def probabilities(self, images: Tensor) -> Tensor:
        """Class probabilities for a uint8 batch (N, C, H, W)."""
        x = self.normalise(images.to(self.device)).to(self.dtype)
        return predict_logits(self.model, x).softmax(1).cpu()

    def probe(self) -> Tensor:
        """`PROBE_BATCH` seeded uint8 images of the net's input shape."""
        generator = torch.Generator().manual_seed(PROBE_SEED)
        shape = (PROBE_BATCH, self.info.channels, *self.preprocessing.crop)
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)

    def _cast(self, tolerance: float) -> float:
        """Cast the net to `self.dtype`, once its probe probabilities are within `tolerance`
        of fp32's (else `PrecisionMismatchError`); how far they are."""
        probe, dtype = self.probe(), self.dtype
        self.dtype = torch.float32
        reference = self.probabilities(probe)
        self.model, self.dtype = self.model.to(dtype), dtype
        difference = (self.probabilities(probe) - reference).abs().max().item()
        if not difference <= tolerance:  # NaN (an overflow) too
            raise PrecisionMismatchError(
                f"in {self.precision} the net's probabilities differ from fp32's by up to "
                f"{difference:.3g} on the {PROBE_BATCH}-image probe batch, over the bound of "
                f"{tolerance:g} (PREDICT_PRECISION_TOLERANCE); serve it in fp32 or bf16"
            )
        return difference

    def classify(self, images: Tensor, top_k: int) -> list[Classification]:
        """The top-k classes of each image of a uint8 batch."""
        k = min(top_k, self.info.num_classes)
        values, indices = self.probabilities(images).topk(k, dim=1)
        return [
            Classification(idx, [self.info.classes[i] for i in idx], vals)
            for idx, vals in zip(indices.tolist(), values.tolist(), strict=True)
        ]
