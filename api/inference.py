"""Serving trained models: an LRU cache of predictors and a micro-batcher per model.

Concurrent requests for one model are gathered into one forward pass on a thread of its
own, so the event loop never runs a model. The queue in front of it is bounded: when it
is full, `submit` raises `Overloaded` and the API answers 503 with Retry-After.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from core.registry import Resolved
from training.inference import Predictor


class Overloaded(RuntimeError):  # noqa: N818 (reads as the state the service is in)
    """The model's queue is full; the client should retry later."""


class Closed(RuntimeError):  # noqa: N818 (reads as the state the batcher is in)
    """The batcher was closed (its model left the cache); get the model again."""


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
        # Forward passes per batch size: a bounded histogram for /predict/stats and the bench.
        self.batch_sizes: Counter[int] = Counter()
        self.closed = False
        self.entry = threading.Lock()  # no request slips in behind the closing marker
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, images: Tensor) -> Future[Tensor]:
        """Queue a uint8 batch (N, C, H, W); the future resolves to its N output rows."""
        request = _Request(images, Future())
        with self.entry:
            if self.closed:
                raise Closed("the model was unloaded")
            try:
                self.queue.put_nowait(request)
            except queue.Full:
                raise Overloaded("the model's request queue is full") from None
        return request.future

    def close(self) -> None:
        """Finish what is queued, then stop the thread; later `submit`s raise `Closed`."""
        with self.entry:
            if self.closed:
                return
            self.closed = True
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
        # A request whose caller went away (its future cancelled) is dropped; the others can
        # no longer be cancelled, so setting their results cannot fail.
        batch = [request for request in batch if request.future.set_running_or_notify_cancel()]
        if not batch:
            return
        try:
            outputs = self.forward(torch.cat([r.images for r in batch]))
        except Exception as error:  # every waiting request learns what went wrong
            for request in batch:
                request.future.set_exception(error)
            return
        self.batch_sizes[outputs.shape[0]] += 1
        start = 0
        for request in batch:
            end = start + request.images.shape[0]
            request.future.set_result(outputs[start:end])
            start = end


SMALL_BATCH = 8  # below it, a forward pass runs on one intra-op thread


def _threads_by_batch(forward: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """`forward` on one intra-op thread for small batches, on all of them for large ones."""
    # Measured on 2 cores: ResNet-20 at batch 1 took 6.3 ms on two threads from a batcher
    # thread (waking the second thread for every layer) and 2.7 ms on one.
    every = torch.get_num_threads()

    def run(images: Tensor) -> Tensor:
        wanted = 1 if images.shape[0] < SMALL_BATCH else every
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)
        return forward(images)

    return run


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
                _threads_by_batch(predictor.probabilities),
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


class RefCache:
    """Model references resolved a moment ago (by database URL and ref), for predictions.

    Registry writes through this process `clear` it after their commit; a write through
    another process reaches this one's predictions within the time to live.
    """

    def __init__(self, *, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self.entries: dict[tuple[str, str], tuple[float, Resolved]] = {}
        self.generation = 0  # bumped by `clear`: a resolution that straddles it is not kept
        self.lock = threading.Lock()

    def get(self, key: tuple[str, str], ttl_s: float) -> Resolved | None:
        """The value kept for `key`, if younger than `ttl_s`."""
        found = self.entries.get(key)
        if found is None or time.monotonic() - found[0] >= ttl_s:
            return None
        return found[1]

    def put(self, key: tuple[str, str], value: Resolved, generation: int) -> None:
        """Keep `value`, unless the cache was cleared since `generation` was read."""
        with self.lock:
            if generation != self.generation:
                return
            if len(self.entries) >= self.max_entries:
                self.entries.clear()
            self.entries[key] = (time.monotonic(), value)

    def clear(self) -> None:
        """Forget everything (a registry write committed)."""
        with self.lock:
            self.generation += 1
            self.entries.clear()


REFS = RefCache()  # one per process: registry writes of this process clear it
