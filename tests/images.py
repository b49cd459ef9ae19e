"""Images for the tests: encoded files, PNGs of one colour, a PNG whose header lies, and the
engine's answer for a split."""

from __future__ import annotations

import io
import struct
import zlib

import torch
from PIL import Image
from torch import nn

from training.data import DatasetInfo, TensorSplit
from training.evaluate import predict_logits
from training.pipeline import make_batches


def encode(image: Image.Image, fmt: str = "PNG") -> bytes:
    """The image as file bytes (PNG by default)."""
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def flat_png(colour: int | tuple[int, int, int] = 128, size: int = 8) -> bytes:
    """A `size` x `size` PNG of one colour: grey for an int, RGB for a triple."""
    mode = "L" if isinstance(colour, int) else "RGB"
    return encode(Image.new(mode, (size, size), colour))


def png_header(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares `width` x `height` pixels (a decompression bomb)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = chunk(b"IDAT", zlib.compress(b"\0"))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + idat + chunk(b"IEND", b"")


def engine_probabilities(model: nn.Module, info: DatasetInfo, split: TensorSplit) -> torch.Tensor:
    """The evaluation engine's class probabilities for a whole split, in order."""
    batches = make_batches(
        split,
        info,
        batch_size=len(split),
        device=torch.device("cpu"),
        augment=False,
        shuffle=False,
        drop_last=False,
        seed=0,
    )
    ((x, _),) = list(batches.epoch(0))
    with torch.no_grad():
        return predict_logits(model, x).softmax(1)
