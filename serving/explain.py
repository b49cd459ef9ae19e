"""Explanations: the Grad-CAM of a prediction, computed in an explain process of its own.

A served model cannot explain: its process runs the net with batch norms folded, or an
ONNX Runtime session, under inference mode. Explanations need the checkpoint's own torch
net and a backward pass, so each checkpoint explained gets a process of its own (`python
-m serving.explain`, started on the first request, a few kept, least recently used
first), framed and launched with `serving.process`'s helpers. The event loop only
resolves, checks and decodes the request, as a prediction does, and awaits the answer.

A request goes through the data plane's reference resolution and visibility check
(`DataPlane.target`), then takes one of `max_running` explanation places before its body
is read (`OverloadedError`, a 503 with Retry-After, when none is free), then has its files
checked before the explain process starts and fitted by the checkpoint's preprocessing
(`serving.files`, the prediction's checks and refusals). One bad file refuses the request.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core import model_registry
from core.errors import InvalidError
from core.owners import Caller
from serving.dataplane import DataPlane, Files, started
from serving.errors import (
    RETRY_AFTER_S,
    InputTooLargeError,
    ModelFailedError,
    OverloadedError,
)
from serving.files import Checked, all_failed, fitted_all, opened_all
from serving.memo import SingleFlight
from serving.process import (
    Images,
    ProcessEnd,
    _Channel,
    _frame,
    checkpoint_parser,
    launch,
    serve_socket,
    threads_for,
)
from training import gradcam
from training.checkpoints import CheckpointError
from training.data import DatasetInfo
from training.gradcam import Heatmaps
from training.pipeline import Normalise
from training.preprocess import Preprocessing
from training.runs import load_trained_model


@dataclass(frozen=True)
class ExplainOptions:
    """How many explain processes are kept and explanations run at once, and how."""

    max_models: int = 1
    max_running: int = 2
    max_images: int = 4
    threads: int = 0  # intra-op threads of each explain process; 0: `threads_for(1)`
    device: str = "cpu"
    start_timeout_s: float = 120.0


@dataclass(frozen=True)
class Explained:
    """An explain process's answer: the heatmaps, and each image's overlay PNG if asked."""

    heatmaps: Heatmaps
    overlays: list[bytes]


@dataclass(slots=True)
class Explanation:
    """An explanation's answer: what the reference resolved to, the checkpoint's classes
    and preprocessing, each file as fitted, its heatmaps and overlays, and timings."""

    target: model_registry.Resolved
    info: DatasetInfo
    preprocessing: Preprocessing
    files: list[Checked]
    explained: Explained
    explain_s: float
    started: float  # when the request came in (`time.perf_counter`)


class ExplainProcess(ProcessEnd[Explained]):
    """The API end of a checkpoint's explain process: one request at a time is computed
    there; the others wait in its socket."""

    @classmethod
    async def start(cls, path: Path, sha256: str, options: ExplainOptions) -> ExplainProcess:
        """Start an explain process of the checkpoint; `CheckpointError` if it cannot load."""
        threads = options.threads or threads_for(1)
        command = ["--checkpoint", str(path), "--sha256", sha256, "--device", options.device]
        command += ["--threads", str(threads)]
        process, reader, writer, hello = await launch(__name__, command, options.start_timeout_s)
        _, info, preprocessing = hello
        return cls(process, reader, writer, info, preprocessing)

    async def explain(self, images: Images, classes: list[int | None], overlays: bool) -> Explained:
        """The Grad-CAM of a uint8 batch (N, C, H, W) for each image's class (None: top)."""
        if self.closed:
            raise ModelFailedError("the explain process stopped; send the request again")
        request = next(self.ids)
        future: asyncio.Future[Explained] = asyncio.get_running_loop().create_future()
        self.pending[request] = future
        try:
            self.writer.write(_frame((request, images, classes, overlays)))
            return await future
        finally:
            del self.pending[request]

    def _received(self, message: Any) -> None:
        kind, request, value = message
        future = self.pending.get(request)
        if future is None or future.done():
            return  # its client went away
        if kind == "done":
            future.set_result(Explained(*value))
        else:
            future.set_exception(ModelFailedError(f"the explanation failed: {value}"))

    def _stopped(self) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ModelFailedError("the explain process stopped"))


class Explainers:
    """Explain processes keyed by checkpoint sha256 (LRU, `max_models` kept), and the
    explanation places (`max_running` at once)."""

    def __init__(self, options: ExplainOptions | None = None) -> None:
        self.options = options or ExplainOptions()
        self.entries: OrderedDict[str, ExplainProcess] = OrderedDict()
        self.starting: SingleFlight[ExplainProcess] = SingleFlight()
        self.stopping: set[asyncio.Task[None]] = set()
        self.running = 0
        self.loads = 0

    def take(self) -> None:
        """Take an explanation place, or raise `OverloadedError` when none is free."""
        if self.running >= self.options.max_running:
            raise OverloadedError(
                f"{self.running} explanations are running, the most at once; "
                f"retry in {RETRY_AFTER_S} s"
            )
        self.running += 1

    def give_back(self) -> None:
        """Give back a place `take` took."""
        self.running -= 1

    async def get(self, path: Path, sha256: str) -> ExplainProcess:
        """The explain process of a checkpoint, started (after its sha256 check) on a miss."""
        found = self.entries.get(sha256)
        if found is not None and not found.closed:
            self.entries.move_to_end(sha256)
            return found
        return await self.starting.run(sha256, lambda: self._start(path, sha256))

    async def _start(self, path: Path, sha256: str) -> ExplainProcess:
        started = await ExplainProcess.start(path, sha256, self.options)
        stale = self.entries.pop(sha256, None)
        if stale is not None:
            self._stop(stale)
        self.entries[sha256] = started
        self.loads += 1
        while len(self.entries) > self.options.max_models:
            # Requests already sent to an evicted process are answered before it stops.
            self._stop(self.entries.popitem(last=False)[1])
        return started

    def _stop(self, explainer: ExplainProcess) -> None:
        task = asyncio.ensure_future(explainer.close())
        self.stopping.add(task)
        task.add_done_callback(self.stopping.discard)

    async def close(self) -> None:
        """Stop every explain process."""
        for explainer in self.entries.values():
            self._stop(explainer)
        self.entries.clear()
        if self.stopping:
            await asyncio.wait(set(self.stopping))


async def explain(
    plane: DataPlane,
    explainers: Explainers,
    ref: str,
    caller: Caller,
    files: Files,
    *,
    wanted: str | None,
    overlays: bool,
) -> Explanation:
    """The Grad-CAM of each of a request's files for class `wanted` (a name or an index;
    None: each image's top class), with overlay PNGs if `overlays`."""
    started = time.perf_counter()
    target = await plane.target(ref, caller)
    explainers.take()  # before the body is read: a busy service reads nothing
    try:
        async with files() as uploads:
            return await _explained(plane, explainers, target, uploads, wanted, overlays, started)
    finally:
        explainers.give_back()


async def _explained(
    plane: DataPlane,
    explainers: Explainers,
    target: model_registry.Resolved,
    uploads: list[Any],
    wanted: str | None,
    overlays: bool,
    started: float,
) -> Explanation:
    most = explainers.options.max_images
    if len(uploads) > most:
        raise InputTooLargeError(
            f"{len(uploads)} files is over the limit of {most} per explanation; "
            "send them in several requests"
        )
    opened = await opened_all(plane.settings, uploads)
    if any(image is None for _, image in opened):  # refused before any process starts
        raise all_failed([file for file, _ in opened])
    explainer = await _load(plane, explainers, target)
    index = class_index(explainer.info, wanted)
    checked = await fitted_all(explainer.preprocessing, opened)
    if any(file.array is None for file in checked):
        raise all_failed(checked)
    batch = np.stack([file.array for file in checked if file.array is not None])
    sent = time.perf_counter()
    explained = await explainer.explain(batch, [index] * len(checked), overlays)
    return Explanation(
        target,
        explainer.info,
        explainer.preprocessing,
        checked,
        explained,
        time.perf_counter() - sent,
        started,
    )


def class_index(info: DatasetInfo, wanted: str | None) -> int | None:
    """The index of the class `wanted` names (a label, or an index); None for the top
    class; else a 422 listing the valid ones."""
    if wanted is None or wanted == "top":
        return None
    if wanted in info.classes:
        return info.classes.index(wanted)
    if wanted.isascii() and wanted.isdigit() and int(wanted) < info.num_classes:
        return int(wanted)
    listed = ", ".join(repr(label) for label in info.classes)
    raise InvalidError(
        f"class {wanted!r} is not one of this model's: give top, an index 0 to "
        f"{info.num_classes - 1}, or one of {listed}",
        field=("query", "class"),
    )


async def _load(
    plane: DataPlane, explainers: Explainers, target: model_registry.Resolved
) -> ExplainProcess:
    """The target's explain process, started after its checkpoint's sha256 check."""
    return await started(plane.settings, target, explainers.get, "explained")


# The explain process's end.


def serve(channel: _Channel, args: argparse.Namespace) -> None:
    """Load the checkpoint's torch net, say so, then answer requests until the input ends."""
    torch.set_num_threads(max(1, args.threads))
    device = torch.device(args.device)
    try:
        trained = load_trained_model(args.checkpoint, sha256=args.sha256, device=device)
        net = gradcam.explainable(trained.model)
        gradcam.last_stage(net)  # a net without residual stages fails here, at start
    except (CheckpointError, OSError, ValueError) as error:
        channel.send(("error", str(error)))
        return
    normalise = Normalise(trained.preprocessing, device, channels_last=False)
    channel.send(("ready", trained.info, trained.preprocessing))
    while (message := channel.receive()) is not None:
        request, images, classes, overlays = message
        try:
            heatmaps = gradcam.grad_cam(
                net, normalise(torch.from_numpy(images).to(device)), classes
            )
            pngs = _overlays(images, heatmaps) if overlays else []
        except Exception as error:  # the request learns what went wrong
            channel.send(("failed", request, f"{type(error).__name__}: {error}"))
            continue
        # Plain values: run as __main__, this module's classes would not unpickle there.
        channel.send(("done", request, (heatmaps, pngs)))


def _overlays(images: Images, heatmaps: Heatmaps) -> list[bytes]:
    """Each image's overlay, as PNG bytes."""
    pairs = zip(images, heatmaps.upsampled, strict=True)
    return [gradcam.png(gradcam.overlay(image, heatmap)) for image, heatmap in pairs]


def main(argv: list[str] | None = None) -> None:
    parser = checkpoint_parser("Explain one checkpoint on an inherited socket.")
    parser.add_argument("--threads", type=int, default=1)
    serve_socket(serve, parser.parse_args(argv))


if __name__ == "__main__":
    main()
