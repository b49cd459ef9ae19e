"""Serving trained models: an LRU cache of predictors and a micro-batcher per model.

Concurrent requests for one model are gathered into one forward pass on a thread of its
own, so the event loop never runs a model. The queue in front of it is bounded: when it
is full, `submit` raises `Overloaded` and the API answers 503 with Retry-After.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from training.inference import Predictor


class Overloaded(RuntimeError):  # noqa: N818 (reads as the state the service is in)
    """The model's queue is full; the client should retry later."""


@dataclass
class _Request:
    images: Tensor
    future: Future[Tensor]


class MicroBatcher:
    """Runs `forward` on batches gathered from concurrent `submit` calls.

    A batch closes when it holds `max_batch` images or `max_wait_s` passed since its first
    request arrived; `max_batch=1` turns batching off (one request per forward).
    """

    def __init__(
        self,
        forward: Callable[[Tensor], Tensor],
        *,
        max_batch: int = 64,
        max_wait_s: float = 0.002,
        max_queue: int = 1024,
        name: str = "batcher",
    ) -> None:
        self.forward = forward
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.queue: queue.Queue[_Request | None] = queue.Queue(maxsize=max_queue)
        self.batch_sizes: list[int] = []  # every batch formed, for the benchmark
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, images: Tensor) -> Future[Tensor]:
        """Queue a uint8 batch (N, C, H, W); the future resolves to its N output rows."""
        request = _Request(images, Future())
        try:
            self.queue.put_nowait(request)
        except queue.Full:
            raise Overloaded("the model's request queue is full") from None
        return request.future

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        self.queue.put(None)
        self.thread.join()

    def _run(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch, closing = self._gather(first)
            self._serve(batch)
            if closing:
                return

    def _gather(self, first: _Request) -> tuple[list[_Request], bool]:
        """Requests for one forward pass, and whether `close` arrived meanwhile."""
        batch, size = [first], first.images.shape[0]
        deadline = time.perf_counter() + self.max_wait_s
        while size < self.max_batch:
            try:
                item = self.queue.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
            size += item.images.shape[0]
        return batch, False

    def _serve(self, batch: list[_Request]) -> None:
        try:
            outputs = self.forward(torch.cat([r.images for r in batch]))
        except Exception as error:  # every waiting request learns what went wrong
            for request in batch:
                request.future.set_exception(error)
            return
        self.batch_sizes.append(outputs.shape[0])
        start = 0
        for request in batch:
            end = start + request.images.shape[0]
            request.future.set_result(outputs[start:end])
            start = end


@dataclass
class Served:
    """A loaded checkpoint and the batcher in front of it."""

    predictor: Predictor
    batcher: MicroBatcher


class ModelCache:
    """Loaded predictors keyed by checkpoint sha256, bounded in count and bytes (LRU)."""

    def __init__(
        self,
        *,
        max_models: int = 4,
        max_bytes: int = 2 * 1024**3,
        max_batch: int = 64,
        max_wait_s: float = 0.002,
        max_queue: int = 1024,
        device: torch.device | None = None,
    ) -> None:
        self.max_models, self.max_bytes = max_models, max_bytes
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
        self.device = device
        self.entries: OrderedDict[str, Served] = OrderedDict()
        self.lock = threading.Lock()
        self.loads = 0

    def get(self, path: Path, sha256: str) -> Served:
        """The served model for a checkpoint, loading it (after its sha256 check) on a miss."""
        with self.lock:
            if sha256 in self.entries:
                self.entries.move_to_end(sha256)
                return self.entries[sha256]
            predictor = Predictor(path, sha256=sha256, device=self.device)
            batcher = MicroBatcher(
                predictor.probabilities,
                max_batch=self.max_batch,
                max_wait_s=self.max_wait_s,
                max_queue=self.max_queue,
                name=f"model-{sha256[:8]}",
            )
            served = Served(predictor, batcher)
            self.entries[sha256] = served
            self.loads += 1
            self._evict()
            return served

    def _evict(self) -> None:
        """Drop least-recently used models beyond the bounds (never the newest)."""
        while len(self.entries) > 1 and (
            len(self.entries) > self.max_models
            or sum(e.predictor.bytes for e in self.entries.values()) > self.max_bytes
        ):
            _, old = self.entries.popitem(last=False)
            # Requests already queued for it are answered before its thread stops.
            threading.Thread(target=old.batcher.close, daemon=True).start()

    def close(self) -> None:
        """Stop every batcher."""
        with self.lock:
            for served in self.entries.values():
                served.batcher.close()
            self.entries.clear()
