"""A trained net as an int8 ONNX graph (ONNX Runtime's static quantization), kept only when
its error on the evaluation split stays within a bound of the float graph's.

The float graph is the served net's ONNX export (`training.export`: batch norms folded,
softmax). `onnxruntime.quantization.quantize_static` quantizes it in the QDQ format with
per-channel int8 weights and uint8 activations, the activations' ranges calibrated (min/max)
on images of the run's TRAINING split. Each image, calibration or evaluation, becomes input
exactly as `/predict` makes it: the checkpoint's declared preprocessing (files decoded and
fitted by `Preprocessing.image`, arrays as held), then `Normalise` in float32.

Both graphs then classify the same images of the evaluation split (the one the run's
dataset spec names, `test` by default; the first `eval_limit` of a seeded order), and the
int8 graph is kept only if its error is at most `bound_pp` percentage points over the float
graph's. Both errors, the images they are over and the two graphs' images/s at
`SPEED_BATCH` on this machine go into the export's details.

Why uint8 activations: on x86 CPUs ONNX Runtime's fast int8 kernels multiply uint8 by int8
(U8S8); int8 activations (S8S8) took ResNet-20 from 1.0x to 0.5x the float graph's speed here.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import torch
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from PIL import Image
from pydantic import TypeAdapter, ValidationError
from torch import Tensor, nn

from models.zoo import TRACING
from training import export
from training.data import DatasetInfo, Split, TensorSplit
from training.evaluation_data import load_for_reading, nonempty_split
from training.pipeline import Normalise
from training.preprocess import Preprocessing
from training.specs import DatasetSpec

DEFAULT_BOUND_PP = 0.5  # percentage points of evaluation error the int8 graph may add
DEFAULT_CALIBRATION = 256  # training images whose activations set the ranges
MAX_CALIBRATION = 10_000
CALIBRATION_BATCH = 32
EVAL_BATCH = 256
SPEED_BATCH = 64
SPEED_ROUNDS = 5  # timed runs of each graph, alternated; the best of each is its figure
SAMPLE_SEED = 0
_DATASET: TypeAdapter[DatasetSpec] = TypeAdapter(DatasetSpec)


class QuantizationDataError(ValueError):
    """The run's dataset cannot be read (imported weights have none; files missing)."""


class Int8OverBoundError(ValueError):
    """The int8 graph's evaluation error is over the float graph's by more than the bound."""

    def __init__(self, float_error: float, int8_error: float, bound_pp: float, images: int):
        super().__init__(
            f"the int8 graph's error on {images} evaluation images is {100 * int8_error:.2f}% "
            f"against the float graph's {100 * float_error:.2f}%: "
            f"{100 * (int8_error - float_error):+.2f} percentage points, over the bound of "
            f"{bound_pp:g}; it was not kept (calibrate on more images, or allow a larger "
            "max_error_increase_pp)"
        )
        self.float_error, self.int8_error = float_error, int8_error
        self.bound_pp, self.images = bound_pp, images


@dataclass(frozen=True)
class Int8Options:
    """How an int8 graph is calibrated and judged."""

    calibration_images: int = DEFAULT_CALIBRATION
    bound_pp: float = DEFAULT_BOUND_PP
    eval_limit: int | None = None  # evaluation images at most; None: the whole split
    threads: int = 0  # ONNX Runtime intra-op threads of evaluation and timing; 0: all cores


def run_dataset(spec: dict[str, Any], *, data_root: Path, download: bool) -> tuple[Any, Any]:
    """The run's dataset (from its checkpoint's spec) and the split it is evaluated on."""
    try:
        dataset = _DATASET.validate_python(spec.get("dataset"))
    except ValidationError:
        raise QuantizationDataError(
            "the checkpoint names no dataset of this service (imported weights): an int8 "
            "export calibrates on the run's training images"
        ) from None
    try:
        data = load_for_reading(dataset, data_root=data_root, download=download)
    except (OSError, ValueError) as error:
        raise QuantizationDataError(f"the run's dataset cannot be read: {error}") from error
    return data, dataset.split


def seeded_order(count: int) -> Tensor:
    """A fixed permutation of `count` indices: samples that span an ordered split's classes."""
    return torch.randperm(count, generator=torch.Generator().manual_seed(SAMPLE_SEED))


def served_images(split: Split, indices: Tensor, preprocessing: Preprocessing) -> Tensor:
    """The split's images at `indices` as uint8 (N, C, H, W), made input as `/predict`
    makes an upload: a file decoded and fitted by the preprocessing, an array as held."""
    if isinstance(split, TensorSplit):
        return split.images[indices]
    arrays = []
    for index in indices.tolist():
        with Image.open(split.paths[index]) as image:
            arrays.append(torch.from_numpy(preprocessing.image(image)))
    return torch.stack(arrays)


def normalised(
    split: Split, indices: Tensor, preprocessing: Preprocessing, batch: int
) -> Iterator[tuple[np.ndarray, Tensor]]:
    """Normalised float32 batches of the split's images at `indices`, with their labels."""
    normalise = Normalise(preprocessing, torch.device("cpu"), channels_last=False)
    for start in range(0, len(indices), batch):
        part = indices[start : start + batch]
        images = normalise(served_images(split, part, preprocessing))
        yield np.ascontiguousarray(images.numpy()), split.labels[part]


class TrainingImages(CalibrationDataReader):  # type: ignore[misc]  # ORT ships no types
    """ONNX Runtime's calibration input: batches of training images, as served."""

    def __init__(self, split: Split, count: int, preprocessing: Preprocessing) -> None:
        indices = seeded_order(len(split))[:count]
        self.batches = (
            {export.INPUT: x}
            for x, _ in normalised(split, indices, preprocessing, CALIBRATION_BATCH)
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next batch, or None when calibration has seen them all."""
        return next(self.batches, None)


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """Without the quantizer's advice to pre-process (the exporter already optimised)."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def quantize(float_graph: Path, out: Path, calibration: CalibrationDataReader) -> None:
    """The float ONNX graph statically quantized: QDQ, per-channel int8 weights, uint8
    activations calibrated (min/max) on `calibration`; the softmax left in float."""
    # The softmax stays float: quantized, probabilities would come in steps of 1/255.
    graph = onnx.load(str(float_graph))
    softmax = [node.name for node in graph.graph.node if node.op_type == "Softmax"]
    with _quiet_quantizer():
        quantize_static(
            str(float_graph),
            str(out),
            calibration,
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=softmax,
        )


def errors(
    sessions: tuple[onnxruntime.InferenceSession, ...],
    split: Split,
    indices: Tensor,
    preprocessing: Preprocessing,
) -> tuple[list[float], float]:
    """Each session's top-1 error over the split's images at `indices`, and the largest
    |p difference| between the first two sessions' probabilities."""
    wrong, worst = [0] * len(sessions), 0.0
    for x, labels in normalised(split, indices, preprocessing, EVAL_BATCH):
        outputs = [session.run([export.OUTPUT], {export.INPUT: x})[0] for session in sessions]
        for which, probabilities in enumerate(outputs):
            wrong[which] += int((torch.from_numpy(probabilities).argmax(1) != labels).sum())
        worst = max(worst, float(np.abs(outputs[0] - outputs[-1]).max()))
    return [count / len(indices) for count in wrong], worst


def images_per_s(
    sessions: tuple[onnxruntime.InferenceSession, ...], info: DatasetInfo, seconds: float = 0.5
) -> list[float]:
    """Each session's best images/s over `SPEED_ROUNDS` runs of about `seconds`, at batch
    `SPEED_BATCH`; the sessions alternate, so a busy machine slows all of them alike."""
    x = np.ascontiguousarray(export.check_batch(info, SPEED_BATCH).numpy())
    best = [0.0] * len(sessions)
    for session in sessions:
        session.run([export.OUTPUT], {export.INPUT: x})  # warm up: allocations, kernels
    for _ in range(SPEED_ROUNDS):
        for which, session in enumerate(sessions):
            runs, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < seconds / SPEED_ROUNDS or not runs:
                session.run([export.OUTPUT], {export.INPUT: x})
                runs += 1
            best[which] = max(best[which], runs * SPEED_BATCH / elapsed)
    return best


def quantize_checked(
    model: nn.Module,
    info: DatasetInfo,
    preprocessing: Preprocessing,
    data: Any,
    eval_split: str,
    path: Path,
    options: Int8Options,
) -> export.Checked:
    """Write `model`'s served net as an int8 ONNX graph to `path`, calibrated on the training
    split of `data`, and keep it only within `options.bound_pp` of the float graph's error on
    `eval_split`; `Int8OverBoundError` (file removed) if over."""
    train = nonempty_split(data, "train")
    evaluated = nonempty_split(data, eval_split)
    net = export.served_net(model)
    with tempfile.TemporaryDirectory(prefix="int8-") as folder:
        float_graph = Path(folder) / "float.onnx"
        with TRACING:
            export.write(net, "onnx", export.check_batch(info), float_graph)
        calibration = min(options.calibration_images, len(train))
        quantize(float_graph, path, TrainingImages(train, calibration, preprocessing))
        threads = options.threads or torch.get_num_threads()
        sessions = (export.ort_session(float_graph, threads), export.ort_session(path, threads))
        indices = seeded_order(len(evaluated))[: options.eval_limit]
        (float_error, int8_error), difference = errors(sessions, evaluated, indices, preprocessing)
        if not (int8_error - float_error) * 100 <= options.bound_pp:
            path.unlink(missing_ok=True)
            raise Int8OverBoundError(float_error, int8_error, options.bound_pp, len(indices))
        float_speed, int8_speed = images_per_s(sessions, info)
    export.annotate(
        path, {"preprocessing": preprocessing.to_record(), "classes": list(info.classes)}
    )
    increase_pp = 100 * (int8_error - float_error)
    details = export.details_of(info, preprocessing) | {
        "quantization": "static, QDQ, per-channel int8 weights, uint8 activations (min/max)",
        "calibration_images": calibration,
        "calibration_split": "train",
        "eval_split": eval_split,
        "eval_images": len(indices),
        "float_error": float_error,
        "int8_error": int8_error,
        "error_increase_pp": increase_pp,
        "max_probability_diff": difference,
        "bound_pp": options.bound_pp,
        "float_images_per_s": round(float_speed, 1),
        "int8_images_per_s": round(int8_speed, 1),
        "speedup": round(int8_speed / float_speed, 3),
        "speed_batch": SPEED_BATCH,
        "threads": threads,
        "reference": "the float ONNX graph of the serving form (batch norms folded)",
        "opset": export.OPSET,
        "onnxruntime": onnxruntime.__version__,
    }
    # The row's check, as for every format: a figure within its bound (here the error added).
    return export.Checked(max(0.0, increase_pp), options.bound_pp, details)
