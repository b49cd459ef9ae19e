"""A loaded checkpoint served by a process of its own, with micro-batching inside it.

Why a process: a forward pass in eager PyTorch takes the GIL back between every layer, so
a model thread sharing the API's process waits up to the interpreter's switch interval
(5 ms) behind the busy event loop at each layer: here ResNet-20 at batch 20 took 60 ms
alone and 670 ms next to a busy Python thread (`python -m bench.serving_form`). In a
process of its own the forward runs at full speed and the event loop never waits for it.

The API end (`ModelProcess`) writes each request's uint8 images to a socket pair and
awaits a future; the model end (`main`, run as `python -m serving.process`) gathers
the requests that are waiting into one forward pass (up to `max_batch` images, waiting at
most `max_wait_s` for more after the first), and answers a whole batch in one message.
While a batch runs, the next requests queue in the socket, so under load batches fill
without waiting.

Messages are length-prefixed pickles on a socket pair only these two processes hold; no
client bytes are ever unpickled (clients' images are decoded by Pillow in the API).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import os
import pickle
import select
import socket
import struct
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt
import onnxruntime
import torch
from starlette.concurrency import run_in_threadpool
from torch import Tensor

from training import export
from training.checkpoints import CheckpointError, sha256_of
from training.data import DatasetInfo
from training.pipeline import Normalise
from training.predictor import DEFAULT_PRECISION_TOLERANCE, DTYPES, Predictor
from training.preprocess import Preprocessing

_LENGTH = struct.Struct("!Q")

Images = npt.NDArray[np.uint8]  # (N, C, H, W)
Probabilities = npt.NDArray[np.float32]  # (N, classes)
Timed = tuple[Probabilities, float]  # and the seconds of the forward pass that made them
_Answer = TypeVar("_Answer")


class Overloaded(RuntimeError):  # noqa: N818 (reads as the state the service is in)
    """The model's queue is full; the client should retry later."""


class Closed(RuntimeError):  # noqa: N818 (reads as the state the model is in)
    """The model was unloaded, or its process stopped; get the model again."""


class ForwardError(RuntimeError):
    """The forward pass of a request's batch raised in the model's process."""


@dataclass(frozen=True)
class ServingOptions:
    """How each model process batches and runs."""

    max_batch: int = 64
    max_wait_s: float = 0.0
    max_queue: int = 1024
    threads: int = 0  # intra-op threads of each process's forward pass; 0: see `threads_for`
    replicas: int = 1  # processes per model; 0: `replicas_for` picks by the cores
    device: str = "cpu"
    fold: bool = True  # serve `training.predictor.serving_form` (batch norms folded)
    backend: str = "torch"  # one of BACKENDS (the app passes PREDICT_BACKEND)
    start_timeout_s: float = 120.0
    precision: str = "fp32"  # the torch backend's: fp32, bf16 or fp16 (PREDICT_PRECISION)
    precision_tolerance: float = DEFAULT_PRECISION_TOLERANCE
    # onnxruntime_int8: a checkpoint's kept int8 graph (its local file and sha256), or a
    # `CheckpointError` saying how to make one (the app passes `core.exports.int8_graph`).
    int8_graph: Callable[[str], tuple[Path, str]] | None = None

    def __post_init__(self) -> None:
        if self.replicas == 0:  # frozen: the choice is made once, here
            object.__setattr__(self, "replicas", replicas_for(len(os.sched_getaffinity(0))))


def replicas_for(cores: int) -> int:
    """Processes per model when PREDICT_REPLICAS is 0: two on two cores or more, else one.

    One model process runs on one core while the API's event loop takes about 0.4 to 0.6
    of another (0.45 ms of CPU per request against the model's 0.72 to 0.8 ms per image at
    c64), so with one replica a core sits partly idle under load. Two replicas of one
    thread each share it without waiting on each other at every layer as two intra-op
    threads do: ResNet-20 at c64 served 979 req/s against 717 with one (raw body, torch,
    `python -m bench.predict_load --replicas 2 --threads 1`), c1 unchanged (a lone request
    goes to an idle replica). One API process feeds no more than about two.
    """
    return 2 if cores >= 2 else 1


def _frame(message: object) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


async def launch(
    module: str, arguments: list[str], timeout_s: float
) -> tuple[subprocess.Popen[bytes], asyncio.StreamReader, asyncio.StreamWriter, tuple[Any, ...]]:
    """Start `python -m module --fd N arguments` on a socket pair and wait for its hello
    ("ready", ...); `CheckpointError` with its reason if it says otherwise or exits."""
    ours, theirs = socket.socketpair()
    command = [sys.executable, "-m", module, "--fd", str(theirs.fileno()), *arguments]
    # Idle OpenMP threads sleep instead of spinning, leaving the CPU to the event loop.
    env = {"OMP_WAIT_POLICY": "PASSIVE"} | os.environ
    with theirs:
        process = await run_in_threadpool(
            subprocess.Popen, command, pass_fds=[theirs.fileno()], env=env
        )
    try:
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        hello = await asyncio.wait_for(_read(reader), timeout_s)
    except BaseException:
        ours.close()
        await _stop(process)
        raise
    if hello is None or hello[0] != "ready":
        writer.close()
        await _stop(process)
        why = hello[1] if hello else f"its process exited with {process.returncode}"
        raise CheckpointError(why)
    return process, reader, writer, hello


class ProcessEnd(ABC, Generic[_Answer]):
    """The API end of a process started by `launch`: its checkpoint's classes and
    preprocessing, its requests in flight (futures by id), and its close.

    A subclass says what a message from the process settles (`_received`) and what the
    requests still in flight learn when the process stops (`_stopped`).
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        info: DatasetInfo,
        preprocessing: Preprocessing,
    ) -> None:
        self.process = process
        self.reader, self.writer = reader, writer
        self.info = info
        self.preprocessing = preprocessing
        self.pending: dict[int, asyncio.Future[_Answer]] = {}
        self.ids = itertools.count()
        self.closed = False
        self.listener = asyncio.ensure_future(self._listen())

    async def close(self) -> None:
        """Answer what was sent, then stop the process; later requests are refused."""
        if not self.closed:
            self.closed = True
            if not self.writer.is_closing():
                self.writer.write_eof()  # the process's end reads the end of its input
        await asyncio.wait({self.listener})
        self.writer.close()
        await _stop(self.process)

    async def _listen(self) -> None:
        try:
            while (message := await _read(self.reader)) is not None:
                self._received(message)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed = True
            self._stopped()

    @abstractmethod
    def _received(self, message: Any) -> None:
        """Settle what a message from the process answers."""

    @abstractmethod
    def _stopped(self) -> None:
        """Settle the requests still in flight: the process stopped."""


class ModelProcess(ProcessEnd[Timed]):
    """The API end: a checkpoint's process, its requests in flight and its batch sizes."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        info: DatasetInfo,
        preprocessing: Preprocessing,
        parameter_bytes: int,
        max_queue: int,
    ) -> None:
        super().__init__(process, reader, writer, info, preprocessing)
        self.bytes = parameter_bytes
        self.max_queue = max_queue
        self.sent: dict[int, tuple[float, str]] = {}  # each request's write time and tag
        self.answered = 0.0  # when the last batch's answer arrived
        # Forward passes per batch size: a bounded histogram for /predict/stats and the bench.
        self.batch_sizes: Counter[int] = Counter()
        # Told each forward pass's size, with the tag of its first request (the metrics).
        self.on_batch: Callable[[str, int], None] | None = None
        self.loop = asyncio.get_running_loop()  # its socket and futures belong to this loop

    @classmethod
    async def start(
        cls,
        path: Path,
        sha256: str,
        options: ServingOptions,
        graph: tuple[Path, str] | None = None,
    ) -> ModelProcess:
        """Start a process serving the checkpoint (by its int8 `graph` for that backend);
        `CheckpointError` if it cannot load it."""
        command = ["--checkpoint", str(path), "--sha256", sha256, "--device", options.device]
        command += ["--max-batch", str(options.max_batch), "--max-wait-s", str(options.max_wait_s)]
        command += ["--threads", str(options.threads or threads_for(options.replicas))]
        command += ["--fold"] if options.fold else []
        command += ["--backend", options.backend, "--precision", options.precision]
        command += ["--precision-tolerance", repr(options.precision_tolerance)]
        command += ["--graph", str(graph[0]), "--graph-sha256", graph[1]] if graph else []
        process, reader, writer, hello = await launch(__name__, command, options.start_timeout_s)
        _, info, preprocessing, parameter_bytes = hello
        return cls(process, reader, writer, info, preprocessing, parameter_bytes, options.max_queue)

    async def predict(self, images: Images) -> Probabilities:
        """The class probabilities of a uint8 batch, computed in one of the next forwards."""
        return (await self.predict_timed(images))[0]

    def predict_timed(self, images: Images, tag: str = "") -> asyncio.Future[Timed]:
        """`predict`, with the seconds its forward pass took as seen from here: from when
        the model's process could start it (its last request written, the pass before it
        answered) to its answer. `tag` names the request to `on_batch`.

        The future itself, not a coroutine awaiting it: each frame between the request's
        task and the future is resumed again when the answer comes. A client that went
        away cancels it; its place in `pending` is kept until its answer arrives (the
        model works on it meanwhile) and dropped then.
        """
        if asyncio.get_running_loop() is not self.loop:
            # An app is served by one event loop; another would wait here forever.
            raise RuntimeError("a model process is used from another event loop than its own")
        if self.closed:
            raise Closed("the model was unloaded")
        if len(self.pending) >= self.max_queue:
            raise Overloaded("the model's request queue is full")
        request = next(self.ids)
        future: asyncio.Future[Timed] = self.loop.create_future()
        self.writer.write(_frame((request, images)))
        self.pending[request] = future
        self.sent[request] = (time.perf_counter(), tag)
        return future

    def _received(self, message: Any) -> None:
        kind, *rest = message
        if kind == "batch":
            self._answered(*rest)
        else:  # "failed": the forward pass raised
            why, requests = rest
            for request in requests:
                self._settle(request, error=ForwardError(why))

    def _stopped(self) -> None:
        for request in list(self.pending):
            self._settle(request, error=Closed("the model's process stopped"))

    def _answered(
        self, requests: list[int], counts: list[int], probabilities: Probabilities
    ) -> None:
        """Settle each request of a batch with its rows of the batch's probabilities."""
        size = len(probabilities)
        self.batch_sizes[size] += 1
        forward_s = self._forward_s(requests, size)
        start = 0
        for request, count in zip(requests, counts, strict=True):
            end = start + count
            self._settle(request, result=(probabilities[start:end], forward_s))
            start = end

    def _forward_s(self, requests: list[int], size: int) -> float:
        """The seconds a pass of `requests` (`size` images) took, from when it could start
        to now; `on_batch` is told its size."""
        now = time.perf_counter()
        sent = [self.sent[request] for request in requests if request in self.sent]
        could_start = max([self.answered, *(at for at, _ in sent)])
        self.answered = now
        if self.on_batch is not None and sent:
            self.on_batch(sent[0][1], size)
        return now - could_start

    def _settle(
        self,
        request: int,
        *,
        result: Timed | None = None,
        error: Exception | None = None,
    ) -> None:
        future = self.pending.pop(request, None)
        self.sent.pop(request, None)
        if future is None or future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]


class Replicas:
    """A checkpoint served by one or more processes; a request goes to the least busy one."""

    def __init__(self, processes: list[ModelProcess]) -> None:
        self.processes = processes
        self.info = processes[0].info
        self.preprocessing = processes[0].preprocessing
        self.bytes = sum(process.bytes for process in processes)

    @classmethod
    async def start(cls, path: Path, sha256: str, options: ServingOptions) -> Replicas:
        """Start `options.replicas` processes; if one cannot load, stop the others and raise."""
        graph = None
        if options.backend == "onnxruntime_int8":
            if options.int8_graph is None:
                raise CheckpointError("the onnxruntime_int8 backend was given no int8 graphs")
            graph = await run_in_threadpool(options.int8_graph, sha256)
        starts = [ModelProcess.start(path, sha256, options, graph) for _ in range(options.replicas)]
        started = await asyncio.gather(*starts, return_exceptions=True)
        processes = [p for p in started if isinstance(p, ModelProcess)]
        failure = next((p for p in started if isinstance(p, BaseException)), None)
        if failure is not None:
            await asyncio.gather(*(process.close() for process in processes))
            raise failure
        return cls(processes)

    @property
    def closed(self) -> bool:
        """Whether a process stopped (the cache then starts the model afresh)."""
        return any(process.closed for process in self.processes)

    @property
    def pending(self) -> int:
        return sum(len(process.pending) for process in self.processes)

    @property
    def batch_sizes(self) -> Counter[int]:
        return sum((process.batch_sizes for process in self.processes), Counter())

    async def predict(self, images: Images) -> Probabilities:
        """The images' probabilities from the process with the fewest requests in flight."""
        return (await self.predict_timed(images))[0]

    def predict_timed(self, images: Images, tag: str = "") -> asyncio.Future[Timed]:
        """`predict` with the seconds of its forward pass (`ModelProcess.predict_timed`)."""
        process = self.processes[0]
        if len(self.processes) > 1:
            process = min(self.processes, key=lambda process: len(process.pending))
        return process.predict_timed(images, tag)

    def observe(self, on_batch: Callable[[str, int], None] | None) -> None:
        """Tell `on_batch` each forward pass's size and the tag of its first request."""
        for process in self.processes:
            process.on_batch = on_batch

    async def close(self) -> None:
        await asyncio.gather(*(process.close() for process in self.processes))


async def _read(reader: asyncio.StreamReader) -> Any:
    """The next message, or None at the end of the stream."""
    try:
        header = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as error:
        if error.partial:
            raise
        return None
    (length,) = _LENGTH.unpack(header)
    return pickle.loads(await reader.readexactly(length))


async def _stop(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Wait for the process to exit (it does once its input ended), killing it if it hangs."""
    try:
        await run_in_threadpool(process.wait, timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        await run_in_threadpool(process.wait)


# The model's end.


class _Channel:
    """Blocking reads and writes of length-prefixed messages on the model's socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, message: object) -> None:
        self.sock.sendall(_frame(message))

    def receive(self) -> Any:
        """The next message, or None at the end of the input."""
        header = self._exactly(_LENGTH.size)
        if header is None:
            return None
        (length,) = _LENGTH.unpack(header)
        payload = self._exactly(length)
        if payload is None:
            raise ConnectionError("the API closed the socket mid-message")
        return pickle.loads(payload)

    def waiting(self, timeout_s: float) -> bool:
        """Whether a message (or the end of the input) arrives within `timeout_s`."""
        return bool(select.select([self.sock], [], [], timeout_s)[0])

    def _exactly(self, size: int) -> bytes | None:
        buffer = bytearray(size)
        view, got = memoryview(buffer), 0
        while got < size:
            count = self.sock.recv_into(view[got:])
            if count == 0:
                if got == 0:
                    return None
                raise ConnectionError("the API closed the socket mid-message")
            got += count
        return bytes(buffer)


def gather(
    channel: _Channel, max_batch: int, max_wait_s: float
) -> tuple[list[tuple[int, Images]], bool]:
    """The requests of one forward pass, and whether the input ended.

    Blocks for the first request; then takes more while they arrive within `max_wait_s`
    of it, until the batch holds `max_batch` images (a request is never split).
    """
    first = channel.receive()
    if first is None:
        return [], True
    batch, size = [first], len(first[1])
    deadline = time.monotonic() + max_wait_s
    while size < max_batch and channel.waiting(max(0.0, deadline - time.monotonic())):
        item = channel.receive()
        if item is None:
            return batch, True
        batch.append(item)
        size += len(item[1])
    return batch, False


def threads_for(replicas: int) -> int:
    """Intra-op threads per model process: the cores but one, shared by the replicas.

    The core left over is the API's. With another process busy on one of 2 cores here,
    ResNet-20's serving form at batch 32 ran 336 images/s on two intra-op threads and 481
    on one (`python -m bench.serving_form`): each layer's threads wait at a barrier for
    the one that is not running.
    """
    return max(1, (len(os.sched_getaffinity(0)) - 1) // replicas)


SMALL_BATCH = 8  # below it, a forward pass runs on one intra-op thread


def by_batch_size(forward: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """`forward` on one intra-op thread for small batches, on all of them for large ones."""
    # Measured on 2 cores: ResNet-20 at batch 1 took 6.3 ms on two threads (waking the
    # second thread for every layer) and 2.7 ms on one.
    every = torch.get_num_threads()

    def run(images: Tensor) -> Tensor:
        wanted = 1 if images.shape[0] < SMALL_BATCH else every
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)
        return forward(images)

    return run


BACKENDS = ("auto", "torch", "onnxruntime", "onnxruntime_int8")
PRECISIONS = tuple(DTYPES)
CUDA_PROVIDER = "CUDAExecutionProvider"


def backend_for(backend: str, device: str, precision: str = "fp32") -> str:
    """The backend that runs a model's forward passes, or a `ValueError` saying why the
    combination cannot run here. `auto` is ONNX Runtime on the CPU in fp32 (ResNet-20's
    served net here: 2.4x torch's images/s at batch 1, 1.1x at 64, and 1.8x to 2x the
    requests/s served; `python -m bench.backends`), and torch on a GPU or in bf16/fp16."""
    cuda = device.startswith("cuda")
    if backend == "auto":
        return "torch" if cuda or precision != "fp32" else "onnxruntime"
    if backend != "torch" and precision != "fp32":
        raise ValueError(
            f"PREDICT_PRECISION={precision} applies to the torch backend; set "
            "PREDICT_BACKEND=torch (or auto), or PREDICT_PRECISION=fp32"
        )
    if backend == "onnxruntime_int8" and cuda:
        raise ValueError(
            "the onnxruntime_int8 backend runs its int8 graphs on the CPU; set "
            "PREDICT_DEVICE=cpu, or serve the GPU with PREDICT_BACKEND=torch"
        )
    if backend == "onnxruntime" and cuda and CUDA_PROVIDER not in ort_providers():
        raise ValueError(
            f"PREDICT_DEVICE={device} with the onnxruntime backend needs ONNX Runtime's "
            f"{CUDA_PROVIDER}; this onnxruntime runs on the CPU only (providers: "
            f"{', '.join(ort_providers())}): install onnxruntime-gpu, or set "
            "PREDICT_BACKEND=torch"
        )
    return backend


def ort_providers() -> list[str]:
    """The execution providers this onnxruntime was built with."""
    return list(onnxruntime.get_available_providers())


def check_serving(options: ServingOptions) -> None:
    """`ValueError` when the options' backend, device and precision cannot serve here: said
    when the app starts, not at a model's first request."""
    backend_for(options.backend, options.device, options.precision)


Forward = Callable[[Tensor], Tensor]  # a uint8 batch's probabilities


def onnxruntime_forward(predictor: Predictor, threads: int, device: str = "cpu") -> Forward:
    """The predictor's net (with its softmax) exported to ONNX in memory and run by ONNX
    Runtime: on the CPU, or by its CUDA provider for a cuda device.

    Checked first like a stored export: probabilities within `training.export.TOLERANCE`
    of the torch net's on the seeded check batch, else `ExportMismatchError`. Batches under
    `SMALL_BATCH` run on a session of one intra-op thread, as the torch backend does.
    """
    net = export.with_softmax(predictor.model).to("cpu")  # exported and checked on the CPU
    batch = export.check_batch(predictor.info)
    model = export.onnx_bytes(net, batch)
    cuda = device.startswith("cuda")
    providers = (CUDA_PROVIDER, "CPUExecutionProvider") if cuda else ("CPUExecutionProvider",)
    small = export.ort_session(model, 1, providers)
    large = export.ort_session(model, threads, providers) if threads > 1 else small
    difference = export.max_abs_diff(lambda x: export.run_ort(large, x), net, batch)
    if not difference <= export.TOLERANCE:
        raise export.ExportMismatchError("onnx", difference)
    return _sessions_forward(predictor, small, large)


def _sessions_forward(
    predictor: Predictor,
    small: onnxruntime.InferenceSession,
    large: onnxruntime.InferenceSession,
) -> Forward:
    """Normalise a uint8 batch as the torch backend does and run it on `small` (under
    `SMALL_BATCH` images) or `large`."""
    normalise = Normalise(predictor.preprocessing, torch.device("cpu"), channels_last=False)

    def run(images: Tensor) -> Tensor:
        session = small if images.shape[0] < SMALL_BATCH else large
        return export.run_ort(session, normalise(images))

    return run


def int8_forward(predictor: Predictor, graph: Path, sha256: str, threads: int) -> Forward:
    """A version's kept int8 graph (`training.quantize`), run by ONNX Runtime on the CPU
    once its bytes match `sha256`; its evaluation error was judged when it was made."""
    if not graph.is_file() or sha256_of(graph) != sha256:
        raise CheckpointError(
            f"the int8 graph {graph.name} is missing or does not have the sha256 {sha256} "
            "recorded for it"
        )
    small = export.ort_session(graph, threads=1)
    large = export.ort_session(graph, threads=threads) if threads > 1 else small
    return _sessions_forward(predictor, small, large)


def forward_for(
    predictor: Predictor, backend: str, threads: int, args: argparse.Namespace | None = None
) -> Forward:
    """The probabilities of a uint8 batch, computed by `backend` (torch, onnxruntime, or
    onnxruntime_int8 with the graph `args` names)."""
    if backend == "onnxruntime":
        return onnxruntime_forward(predictor, threads, str(predictor.device))
    if backend == "onnxruntime_int8":
        if args is None or args.graph is None:  # `Replicas.start` passes it
            raise CheckpointError("the onnxruntime_int8 backend was given no int8 graph")
        return int8_forward(predictor, args.graph, args.graph_sha256, threads)
    return by_batch_size(predictor.probabilities)


def serve(channel: _Channel, args: argparse.Namespace) -> None:
    """Load the checkpoint, say so, then answer batches until the input ends."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        backend = backend_for(args.backend, args.device, args.precision)
        predictor = Predictor(
            args.checkpoint,
            sha256=args.sha256,
            device=torch.device(args.device),
            fold=args.fold,
            precision=args.precision,
            tolerance=args.precision_tolerance,
        )
        forward = forward_for(predictor, backend, torch.get_num_threads(), args)
    except (CheckpointError, OSError, ValueError) as error:
        channel.send(("error", str(error)))
        return
    gc.collect()
    gc.freeze()  # torch and the net live as long as the process: never scan them again
    channel.send(("ready", predictor.info, predictor.preprocessing, predictor.bytes))
    ended = False
    while not ended:
        batch, ended = gather(channel, args.max_batch, args.max_wait_s)
        if not batch:
            break
        requests = [request for request, _ in batch]
        try:
            inputs = torch.from_numpy(np.concatenate([images for _, images in batch]))
            probabilities = forward(inputs).numpy()
        except Exception as error:  # every request of the batch learns what went wrong
            channel.send(("failed", f"{type(error).__name__}: {error}", requests))
            continue
        # One array for the whole batch: pickling a slice per request cost more than the
        # answer's bytes (165 us for 64 rows against 8 us for one array and the ids).
        counts = [len(images) for _, images in batch]
        channel.send(("batch", requests, counts, probabilities))


def checkpoint_parser(description: str) -> argparse.ArgumentParser:
    """The command line every process `launch` starts takes: its socket's file descriptor
    and the checkpoint it loads (path, sha256, device)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--sha256", required=True)
    parser.add_argument("--device", default="cpu")
    return parser


def serve_socket(
    serve: Callable[[_Channel, argparse.Namespace], None], args: argparse.Namespace
) -> None:
    """`serve` on the socket `args.fd` names, until the API's end of it closes."""
    # ConnectionError: the API went away, and nobody is left to answer.
    with socket.socket(fileno=args.fd) as sock, contextlib.suppress(ConnectionError):
        serve(_Channel(sock), args)


def main(argv: list[str] | None = None) -> None:
    parser = checkpoint_parser("Serve one checkpoint on an inherited socket.")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-wait-s", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--fold", action="store_true")
    parser.add_argument("--backend", choices=BACKENDS, default="torch")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--precision-tolerance", type=float, default=DEFAULT_PRECISION_TOLERANCE)
    parser.add_argument("--graph", type=Path, default=None)  # onnxruntime_int8's graph
    parser.add_argument("--graph-sha256", default=None)
    serve_socket(serve, parser.parse_args(argv))


if __name__ == "__main__":
    main()
