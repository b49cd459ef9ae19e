"""The payload log: a sample of the images served, with their answers, kept in the store.

As KServe's inference logger does, but never on the request's path: the data plane's tap
(`PayloadLog.tap`, on the event loop) draws each image of an answered batch with
probability PAYLOAD_LOG_SAMPLE and appends a reference to it to an in-memory buffer of at
most PAYLOAD_LOG_BUFFER records (beyond, the image is dropped and counted); it never
awaits. A task on the API's event loop (`PayloadLog.run`) takes the buffer every
PAYLOAD_LOG_FLUSH_SECONDS, or once PAYLOAD_LOG_BATCH records wait, and writes it in a
worker thread: per version a segment, gzip'd JSON Lines of one record per image

    {"time", "model", "version", "job_id", "ref", "caller", "latency_ms", "sha256",
     "shape", "top": [{"label", "index", "probability"}, ...], "image_png"?}

where `sha256` is the digest of the uint8 C x H x W array the model took and `image_png`
(base64, with PAYLOAD_LOG_IMAGES) that array as a PNG. A segment's object name carries its
first and last record's time, its record count and its sha256
(`<first ms>-<last ms>-<records>-<sha256>.jsonl.gz`, under `core.layout.payload_prefix`
or `job_payload_prefix`), so the store's listing is the index and a download is verified
with no table. After each write the version's oldest segments go while its segments pass
PAYLOAD_LOG_MAX_BYTES, and any older than PAYLOAD_LOG_MAX_AGE_DAYS (every version's, once
an hour). A segment the store refuses is kept and put again at a later flush, after a
wait that doubles with each refusal from PAYLOAD_LOG_FLUSH_SECONDS up to RETRY_MAX_S; the
segments kept hold at most PAYLOAD_LOG_BUFFER records in all, and beyond, the oldest are
dropped and counted as lost. Segments go in the order their records were served, none
past one the store refused, and a segment put again has the same name (its sha256 in it),
so a put that did land is overwritten, not doubled. `stop` has `run` write what is
buffered and kept before it returns: a clean stop of the server loses nothing the store
takes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import hashlib
import io
import json
import logging
import random
import re
import tempfile
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from PIL import Image
from starlette.concurrency import run_in_threadpool

from core import layout
from core.model_registry import Resolved
from core.settings import Settings
from core.storage import Store, StoreError
from serving.dataplane import Served, label_of
from serving.metrics import WatchMetrics

log = logging.getLogger(__name__)

TOP_K = 5  # the classes a record keeps of each answer
SUFFIX = ".jsonl.gz"
SEGMENT = re.compile(
    r"(?P<first>\d{13})-(?P<last>\d{13})-(?P<records>\d{1,9})-(?P<sha256>[0-9a-f]{64})\.jsonl\.gz"
)
SWEEP_EVERY_S = 3600.0  # every version's age bound, also of versions no longer served
RETRY_MAX_S = 300.0  # the longest a refused segment waits for its next put
Classes = Callable[[str], tuple[str, ...] | None]  # a checkpoint's class names, by sha256


@dataclass(frozen=True, slots=True)
class Segment:
    """One stored segment of a version's payload log, as its object's name and size say."""

    name: str
    key: str
    records: int
    bytes: int
    first: datetime
    last: datetime
    sha256: str


@dataclass(frozen=True, slots=True)
class Sampled:
    """Images of one answered batch drawn for the log, as the tap noted them."""

    served: Served
    indexes: tuple[int, ...]
    at: float  # `time.time()` of the answer
    classes: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class Pending:
    """A segment's records not in the store yet: just made, or refused and kept to retry."""

    prefix: str
    label: str
    records: list[dict[str, Any]]


class PayloadLog:
    """The sampled payloads of a server's predictions: buffered by the tap, written by `run`."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        metrics: WatchMetrics,
        classes: Classes,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.store, self.metrics = settings, store, metrics
        self.classes, self.rng, self.clock = classes, rng, clock
        self.buffer: list[Sampled] = []
        self.buffered = 0  # records in `buffer`
        self.dropped = 0  # records the full buffer turned away
        self.lost = 0  # records refused by the store and dropped (or never made)
        self.pending: deque[Pending] = deque()  # segments to put, oldest first
        self.pending_records = 0  # records in `pending`
        self._refusals = 0  # puts refused in a row
        self._retry_at = float("-inf")  # `clock()` before which no put is tried again
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._swept = float("-inf")  # when every version's age bound was last applied

    def tap(self, served: Served) -> None:
        """Draw the batch's images for the log and buffer them (never waits)."""
        sample = self.settings.payload_log_sample
        if sample <= 0:
            return
        count = len(served.images)
        picked = range(count) if sample >= 1 else [i for i in range(count) if self.rng() < sample]
        room = max(0, self.settings.payload_log_buffer - self.buffered)
        kept = tuple(picked[:room])
        if len(kept) < len(picked):
            self.dropped += len(picked) - len(kept)
            self.metrics.dropped.labels(label_of(served.target)).inc(len(picked) - len(kept))
        if not kept:
            return
        if len(kept) < count:  # only the drawn images stay in memory, not their whole batch
            drawn = list(kept)
            images, probabilities = served.images[drawn], served.probabilities[drawn]
            served = Served(served.target, served.caller, images, probabilities, served.latency_s)
            kept = tuple(range(len(drawn)))
        self.buffer.append(Sampled(served, kept, time.time(), self.classes(served.target.sha256)))
        self.buffered += len(kept)
        if self.buffered >= self.settings.payload_log_batch and self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Write the buffer every flush interval, or as soon as a batch waits, until `stop`
        (which writes what is left)."""
        self._wake = asyncio.Event()
        while not self._stopping:
            with contextlib.suppress(TimeoutError):  # the flush interval passed
                await asyncio.wait_for(self._wake.wait(), self.settings.payload_log_flush_seconds)
            self._wake.clear()
            await self.flush()
        await self.flush(last=True)  # what was buffered while the last write ran, and kept

    def stop(self) -> None:
        """Have `run` write what is buffered and return."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()

    async def flush(self, *, last: bool = False) -> None:
        """Make segments of what is buffered, queue them behind those kept, and put the
        queue in a worker thread once the wait after a refusal is over (at once with `last`,
        which counts as lost what the store still refuses)."""
        taken, self.buffer, self.buffered = self.buffer, [], 0
        if taken:
            settings = self.settings
            try:
                made = await run_in_threadpool(
                    segments_of, taken, settings.payload_log_batch, settings.payload_log_images
                )
            except Exception:  # what watches traffic never stops the server: logged, counted
                self.lost += sum(len(sampled.indexes) for sampled in taken)
                log.exception("payload records were lost making them")
            else:
                self._keep(made)
        sweep = time.time() - self._swept >= SWEEP_EVERY_S
        send = bool(self.pending) and (last or self.clock() >= self._retry_at)
        if send or sweep:
            try:
                await run_in_threadpool(self.write, sweep, send)
            except Exception:  # the segments not put stay kept
                log.exception("payload segments were not written")
        if last:
            for pending in self.pending:
                self._lose(pending.label, len(pending.records), "the server stopped first")
            self.pending.clear()
            self.pending_records = 0

    def write(self, sweep: bool = False, send: bool = True) -> None:
        """Put the segments kept (with `send`), then hold the versions written to their
        bounds (every version's, with `sweep`)."""
        written = self._send() if send else set()
        now = time.time()
        if sweep:
            self._swept = now
        for prefix in self._prefixes() if sweep else sorted(written):
            try:
                bound(self.store, prefix, self.settings, now, self.metrics)
            except StoreError as error:
                log.warning("payload segments under %s were not bounded: %s", prefix, error)

    def _keep(self, made: list[Pending]) -> None:
        """Queue segments behind those kept; beyond PAYLOAD_LOG_BUFFER records in all, the
        oldest records go, counted as lost."""
        self.pending.extend(made)
        self.pending_records += sum(len(pending.records) for pending in made)
        while self.pending_records > self.settings.payload_log_buffer:
            oldest = self.pending[0]
            gone = min(len(oldest.records), self.pending_records - self.settings.payload_log_buffer)
            if gone == len(oldest.records):
                self.pending.popleft()
            else:
                self.pending[0] = Pending(oldest.prefix, oldest.label, oldest.records[gone:])
            self.pending_records -= gone
            self._lose(oldest.label, gone, "more were kept than PAYLOAD_LOG_BUFFER")

    def _send(self) -> set[str]:
        """Put the kept segments, oldest first, until the store refuses one; the prefixes
        written."""
        written: set[str] = set()
        while self.pending:
            pending = self.pending[0]
            try:
                put_segment(self.store, pending.prefix, pending.records)
            except Exception as error:  # StoreError, or a temporary file not written
                self._refused(pending, error)
                break
            self.pending.popleft()
            self.pending_records -= len(pending.records)
            self._refusals = 0
            self.metrics.logged.labels(pending.label).inc(len(pending.records))
            written.add(pending.prefix)
        return written

    def _refused(self, pending: Pending, error: Exception) -> None:
        """Wait before the next put: the flush interval, doubled with each refusal in a row."""
        self._refusals += 1
        doubled = 2 ** min(self._refusals - 1, 16)
        wait = min(RETRY_MAX_S, self.settings.payload_log_flush_seconds * doubled)
        self._retry_at = self.clock() + wait
        log.warning(
            "the store refused a payload segment of %s; %d records are kept, tried in %.0f s: %s",
            pending.label,
            self.pending_records,
            wait,
            error,
            exc_info=not isinstance(error, StoreError),
        )

    def _lose(self, label: str, count: int, why: str) -> None:
        """Count records as lost."""
        self.lost += count
        self.metrics.lost.labels(label).inc(count)
        log.warning("%d payload records of %s were lost: %s", count, label, why)

    def _prefixes(self) -> list[str]:
        """The folders of every version's segments in the store."""
        try:
            keys = self.store.keys(f"{layout.PAYLOADS}/")
        except StoreError as error:
            log.warning("payload segments were not listed for their age bound: %s", error)
            return []
        return sorted({key.rpartition("/")[0] + "/" for key in keys})


def segments_of(taken: list[Sampled], size: int, with_images: bool) -> list[Pending]:
    """The records of `taken` per version (or job), in segments of at most `size` records,
    in the order they were served."""
    by_prefix: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    labels: dict[str, str] = {}
    for sampled in taken:
        target = sampled.served.target
        prefix = prefix_of(target)
        labels[prefix] = label_of(target)
        by_prefix[prefix] += [record(sampled, index, with_images) for index in sampled.indexes]
    return [
        Pending(prefix, labels[prefix], records[start : start + size])
        for prefix, records in by_prefix.items()
        for start in range(0, len(records), size)
    ]


def prefix_of(target: Resolved) -> str:
    """The key prefix of a served target's segments: its version's, or its job's."""
    if target.model is not None and target.version is not None:
        return layout.payload_prefix(target.model, target.version)
    return layout.job_payload_prefix(target.job_id)


def record(sampled: Sampled, index: int, with_image: bool) -> dict[str, Any]:
    """The log's record of one image of a batch."""
    served, target = sampled.served, sampled.served.target
    image = served.images[index]
    probabilities = served.probabilities[index]
    top = probabilities.argsort()[::-1][:TOP_K]
    classes = sampled.classes
    found: dict[str, Any] = {
        "time": datetime.fromtimestamp(sampled.at, UTC).isoformat(),
        "model": target.model,
        "version": target.version,
        "job_id": str(target.job_id),
        "ref": target.ref,
        "caller": str(served.caller.owner) if served.caller.owner else None,
        "latency_ms": round(served.latency_s * 1000, 3),
        "sha256": digest(image),
        "shape": list(image.shape),
        "top": [
            {
                "label": classes[i] if classes is not None else str(i),
                "index": int(i),
                "probability": float(probabilities[i]),
            }
            for i in top
        ],
    }
    if with_image:
        found["image_png"] = base64.b64encode(png(image)).decode()
    return found


def digest(image: Any) -> str:
    """The sha256 of a uint8 C x H x W array's bytes, as the model took it (C order)."""
    return hashlib.sha256(image.tobytes(order="C")).hexdigest()


def png(image: Any) -> bytes:
    """A uint8 C x H x W array (1 or 3 channels) as a PNG file."""
    pixels = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def put_segment(store: Store, prefix: str, records: list[dict[str, Any]]) -> str:
    """Store `records` as one segment under `prefix`; its key."""
    first, last = (
        int(datetime.fromisoformat(r["time"]).timestamp() * 1000) for r in (records[0], records[-1])
    )
    with tempfile.TemporaryDirectory(prefix="payloads-") as folder:
        path = Path(folder) / "segment"
        with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
            for found in records:
                out.write(json.dumps(found, separators=(",", ":")).encode() + b"\n")
        sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        name = f"{first:013d}-{max(first, last):013d}-{len(records)}-{sha256}{SUFFIX}"
        key = layout.payload_key(prefix, name)
        store.put(key, path, sha256)
    return key


def segments(store: Store, prefix: str) -> list[Segment]:
    """The segments under `prefix`, oldest first (objects not named as segments are left out)."""
    found = []
    for key, size in store.sizes(prefix).items():
        name = key.removeprefix(prefix)
        segment = parse(key, name, size)
        if segment is not None:
            found.append(segment)
    return sorted(found, key=lambda s: s.name)


def parse(key: str, name: str, size: int) -> Segment | None:
    """The segment an object's name describes, or None when it names none."""
    match = SEGMENT.fullmatch(name)
    if match is None:
        return None
    return Segment(
        name,
        key,
        int(match["records"]),
        size,
        _time(int(match["first"])),
        _time(int(match["last"])),
        match["sha256"],
    )


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def bound(store: Store, prefix: str, settings: Settings, now: float, metrics: WatchMetrics) -> int:
    """Delete the oldest segments under `prefix` while they pass PAYLOAD_LOG_MAX_BYTES, and
    those older than PAYLOAD_LOG_MAX_AGE_DAYS; how many went."""
    found = segments(store, prefix)
    total = sum(segment.bytes for segment in found)
    cutoff = now - settings.payload_log_max_age_days * 86400
    deleted = 0
    for segment in found:  # oldest first
        old = segment.last.timestamp() < cutoff
        if old or total > settings.payload_log_max_bytes:
            store.delete_prefix(segment.key)  # the sha256 in its name makes the key unique
            total -= segment.bytes
            deleted += 1
            metrics.deleted.labels("age" if old else "bytes").inc()
    return deleted


def read_records(path: Path) -> Iterable[dict[str, Any]]:
    """The records of a segment's file, in order."""
    with gzip.open(path, "rt") as lines:
        for line in lines:
            yield json.loads(line)
