"""Prometheus metrics: requests and latencies per route template, jobs by status, queue
depth, and per served model its requests, latencies, batch sizes, images and errors
(`serving.metrics`).

Each app has its own registry, so several apps (tests) can live in one process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.schemas import API_PREFIX
from core import queue
from core.db.session import session_scope
from core.db.tables import JOB_STATUSES, Job
from core.settings import Settings
from serving.metrics import ModelMetrics

log = logging.getLogger(__name__)


class Telemetry:
    """An app's registry and its request instruments."""

    def __init__(self, settings: Settings) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "resnet_http_requests",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "resnet_http_request_duration_seconds",
            "HTTP request latency by method and route template (streams: their duration).",
            ["method", "route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.registry.register(_ServiceCollector(settings))
        self.models = ModelMetrics(self.registry)


class _ServiceCollector(Collector):
    """Jobs by status and the queue depth, read when Prometheus scrapes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("resnet_jobs", "Jobs by status.", labels=["status"])
        try:
            with session_scope(self.settings.database_url) as session:
                query = select(Job.status, func.count()).group_by(Job.status)
                counts = {status: count for status, count in session.execute(query)}
        except SQLAlchemyError:
            log.exception("cannot count jobs for /metrics")
        else:
            for status in JOB_STATUSES:
                jobs.add_metric([status], counts.get(status, 0))
            yield jobs
        yield from self._queue_depth()

    def _queue_depth(self) -> Iterator[Metric]:
        settings = self.settings
        try:
            depth = queue.depth(settings, timeout=settings.probe_timeout_seconds)
        except Exception:  # any broker failure: leave the gauge out of this scrape
            log.exception("cannot read the queue depth for /metrics")
            return
        yield GaugeMetricFamily(
            "resnet_queue_depth",
            "Job ids waiting on the job queues (cpu, gpu, gpu-N).",
            value=depth,
        )


class RequestMetrics:
    """ASGI middleware counting requests and timing them by route template."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry
        # Series by labels: `labels()` hashes and locks on each call, this a dict lookup.
        self.counted: dict[tuple[str, str, int], Any] = {}
        self.timed: dict[tuple[str, str], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            elapsed = time.perf_counter() - started
            self._note(scope["method"], _template(scope), status, elapsed)

    def _note(self, method: str, route: str, status: int, elapsed: float) -> None:
        counted = self.counted.get((method, route, status))
        if counted is None:
            counted = self.telemetry.requests.labels(method, route, str(status))
            self.counted[method, route, status] = counted
        counted.inc()
        timed = self.timed.get((method, route))
        if timed is None:
            timed = self.timed[method, route] = self.telemetry.latency.labels(method, route)
        timed.observe(elapsed)


def _template(scope: Scope) -> str:
    """The route template a request matched, e.g. /api/v1/jobs/{job_id}; or "unmatched"."""
    path = getattr(scope.get("route"), "path", None)
    if path is None:
        return "unmatched"
    # The API's routers are mounted under API_PREFIX (api/app.py); a route knows its own part.
    if scope["path"].startswith(API_PREFIX + "/") and not path.startswith(API_PREFIX + "/"):
        return f"{API_PREFIX}{path}"
    return str(path)
