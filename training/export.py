"""A trained net in deployment formats (ONNX, TorchScript, torch.export), checked against
the eager net before anyone keeps it.

What is exported is the net the model processes serve, as is: `serving_form` (batch norms
folded into the convolutions) followed by a softmax. Every format therefore maps a
normalised float32 batch (N, C, H, W), N free, to class PROBABILITIES (N, classes); the
normalisation `(x / 255 - mean) / std` stays outside, its mean and std in `details`.

ONNX goes through `torch.onnx.export(dynamo=True)` (torch.export's graph, translated by
onnxscript, then optimised): the exporter torch maintains, where the TorchScript-based one
is deprecated; and its graph runs faster in ONNX Runtime (ResNet-20's served net on one
thread: 0.9 ms at batch 1 and 6.3 ms at batch 8, against 3.9 and 23 ms for the other
exporter's graph). It takes about 3 s for ResNet-20 on a CPU core (1.3 s once the
exporter was used in the process), more on a busy machine.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import onnx
import onnxruntime
import torch
from torch import Tensor, nn

from models.zoo import TRACING
from training.data import DatasetInfo
from training.pipeline import Normalise
from training.predictor import serving_form
from training.preprocess import Preprocessing

Format = Literal["onnx", "torchscript", "torch_export", "onnx_int8"]
FORMATS: tuple[Format, ...] = get_args(Format)
# The formats checked against the eager net's probabilities; onnx_int8 is judged by its
# error on the evaluation split instead (`training.quantize`).
FLOAT_FORMATS: tuple[Format, ...] = ("onnx", "torchscript", "torch_export")
ONNX_FORMATS: tuple[Format, ...] = ("onnx", "onnx_int8")
SUFFIXES: dict[Format, str] = {
    "onnx": ".onnx",
    "torchscript": ".torchscript.pt",
    "torch_export": ".pt2",
    "onnx_int8": ".int8.onnx",
}
OPSET = 20  # the dynamo exporter's own default in torch 2.14; ONNX Runtime 1.32 runs it
INPUT, OUTPUT = "images", "probabilities"
MAX_BATCH = 4096  # the dynamic batch axis's upper bound (torch.export wants one)
# Probabilities of an export may differ from the eager net's by float rounding only: kernels
# that sum in another order, fused ops. Those differences are under 1e-5 here (the folded
# net alone: under 1e-6); a wrong graph (a branch traced away, a fold gone wrong) moves
# probabilities by 1e-2 and more. 1e-4 keeps the first and refuses the second.
TOLERANCE = 1e-4
CHECK_BATCH = 8  # images of the check, seeded: the same inputs on every run
CHECK_SEED = 0


class ExportMismatchError(ValueError):
    """An export's probabilities are farther from the eager net's than `TOLERANCE`."""

    def __init__(self, fmt: str, max_abs_diff: float, tolerance: float = TOLERANCE) -> None:
        super().__init__(
            f"the {fmt} export's probabilities differ from the eager net's by up to "
            f"{max_abs_diff:.3g}, over the bound of {tolerance:g}; it was not kept"
        )
        self.max_abs_diff = max_abs_diff


@dataclass(frozen=True)
class Checked:
    """An export written and compared with the eager net: how close, and how it was made."""

    max_abs_diff: float
    tolerance: float
    details: dict[str, Any]


def with_softmax(net: nn.Module) -> nn.Module:
    """`net` (logits) followed by a softmax over classes, in eval mode."""
    return nn.Sequential(net, nn.Softmax(dim=1)).eval()


def served_net(model: nn.Module) -> nn.Module:
    """What is exported: the eval-mode net's serving form, then a softmax."""
    return with_softmax(serving_form(model.eval()))


def check_batch(info: DatasetInfo, size: int = CHECK_BATCH) -> Tensor:
    """`size` seeded random uint8 images of the data's shape, normalised as served."""
    generator = torch.Generator().manual_seed(CHECK_SEED)
    shape = (size, info.channels, *info.image_size)
    images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    return Normalise(info, torch.device("cpu"), channels_last=False)(images)


def _dynamic_batch() -> tuple[dict[int, Any]]:
    return ({0: torch.export.Dim("batch", min=1, max=MAX_BATCH)},)


def onnx_bytes(net: nn.Module, example: Tensor) -> bytes:
    """`net` as an ONNX model (opset `OPSET`, dynamic batch axis), serialised."""
    program = torch.onnx.export(
        net,
        (example,),
        dynamo=True,
        opset_version=OPSET,
        dynamic_shapes=_dynamic_batch(),
        input_names=[INPUT],
        output_names=[OUTPUT],
        verbose=False,
    )
    assert program is not None  # dynamo=True always returns the program
    data: bytes = program.model_proto.SerializeToString()
    return data


@contextmanager
def _quiet() -> Iterator[None]:
    """Without torch.jit's deprecation warnings (TorchScript is a format users still ask
    for) and torch.export's notes on the weights it saves."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", "No complete tensor found", UserWarning)
        yield


def write(net: nn.Module, fmt: Format, example: Tensor, path: Path) -> None:
    """Save `net` in `fmt` to `path`, traced on `example` with a dynamic batch axis."""
    with torch.no_grad(), _quiet():
        if fmt == "onnx":
            path.write_bytes(onnx_bytes(net, example))
        elif fmt == "torchscript":
            torch.jit.save(torch.jit.trace(net, example), str(path))
        elif fmt == "onnx_int8":  # it needs calibration images: `training.quantize`
            raise ValueError("an int8 graph is made by training.quantize.quantize_checked")
        else:
            program = torch.export.export(net, (example,), dynamic_shapes=_dynamic_batch())
            torch.export.save(program, path)


def annotate(path: Path, facts: dict[str, Any]) -> None:
    """Add `facts` to an ONNX file's metadata, each as JSON under its key."""
    model = onnx.load(str(path))
    for key, value in facts.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    onnx.save(model, str(path))


def ort_session(
    model: bytes | Path, threads: int = 1, providers: Sequence[str] = ("CPUExecutionProvider",)
) -> onnxruntime.InferenceSession:
    """An ONNX Runtime session of `model` on `providers` (the CPU by default), with `threads`
    intra-op threads."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1  # a ResNet is one chain of ops: nothing to overlap
    source = model if isinstance(model, bytes) else str(model)
    return onnxruntime.InferenceSession(source, options, providers=list(providers))


def run_ort(session: onnxruntime.InferenceSession, x: Tensor) -> Tensor:
    """Probabilities of a normalised batch from an ONNX session of an export."""
    inputs = np.ascontiguousarray(x.numpy(), dtype=np.float32)
    (probabilities,) = session.run([OUTPUT], {INPUT: inputs})
    return torch.from_numpy(probabilities)


def load(fmt: Format, path: Path) -> Callable[[Tensor], Tensor]:
    """A saved export as a function: normalised batch to probabilities."""
    if fmt in ONNX_FORMATS:
        session = ort_session(path)
        return lambda x: run_ort(session, x)
    with _quiet():
        module = (
            torch.jit.load(str(path)) if fmt == "torchscript" else torch.export.load(path).module()
        )
    return lambda x: module(x)


def max_abs_diff(run: Callable[[Tensor], Tensor], net: nn.Module, batch: Tensor) -> float:
    """max |p_export - p_eager| over `batch`, and over its first image alone (a batch of 1:
    the batch axis really is free)."""
    with torch.inference_mode():
        worst = 0.0
        for x in (batch, batch[:1]):
            worst = max(worst, (run(x) - net(x)).abs().max().item())
    return worst


def export_checked(
    model: nn.Module,
    info: DatasetInfo,
    fmt: Format,
    path: Path,
    preprocessing: Preprocessing | None = None,
    tolerance: float = TOLERANCE,
) -> Checked:
    """Write `model`'s served net in `fmt` to `path`, load it back and compare its
    probabilities with the eager net's; `ExportMismatchError` (file removed) if over
    `tolerance`.

    The checkpoint's declared preprocessing goes into `details` (and into an ONNX file's
    metadata, `preprocessing` and `classes` as JSON), so an export says how images become
    its input."""
    batch = check_batch(info)
    declared = (preprocessing or Preprocessing.of(info)).to_record()
    with TRACING:  # one trace or MAC count at a time in a process (see models.zoo)
        net = served_net(model)
        write(net, fmt, batch, path)
    if fmt == "onnx":
        annotate(path, {"preprocessing": declared, "classes": list(info.classes)})
    difference = max_abs_diff(load(fmt, path), net, batch)
    if not difference <= tolerance:  # NaN too
        path.unlink(missing_ok=True)
        raise ExportMismatchError(fmt, difference, tolerance)
    details = details_of(info, preprocessing) | {
        "batches_checked": [len(batch), 1],
        "check_seed": CHECK_SEED,
        "reference": "the eager serving form (batch norms folded) with softmax",
    }
    if fmt == "onnx":
        details |= {"opset": OPSET, "onnxruntime": onnxruntime.__version__}
    return Checked(difference, tolerance, details)


def details_of(info: DatasetInfo, preprocessing: Preprocessing | None) -> dict[str, Any]:
    """What every export's details say: its input and output, classes and preprocessing."""
    return {
        "softmax": True,
        "input": f"float32 (N, {info.channels}, {info.image_size[0]}, {info.image_size[1]}), "
        "normalised: (x / 255 - mean) / std",
        "input_shape": [info.channels, *info.image_size],
        "mean": list(info.mean),
        "std": list(info.std),
        "classes": list(info.classes),
        "preprocessing": (preprocessing or Preprocessing.of(info)).to_record(),
        "torch": torch.__version__,
    }
