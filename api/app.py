"""The FastAPI application: routers under /api/v1 (mounted once), one error shape, limits.

Run it with `uvicorn --factory api.app:create_app`; it refuses to start on a database
that is not migrated to head, unless MIGRATE_ON_START is set (the embedded mode).
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypedDict

from fastapi import APIRouter, FastAPI
from starlette.concurrency import run_in_threadpool

from api import edge, errors, grpc, ratelimit
from api.deps import KeyCache
from api.hot_routes import hot_routes
from api.limits import BodyLimit, PredictShed
from api.routers import (
    artifacts,
    dashboard,
    datasets,
    explain,
    exports,
    health,
    imports,
    inference,
    jobs,
    keys,
    model_registry,
    payloads,
    predict,
    studies,
    usage,
    whoami,
    workers,
    zoo,
)
from api.schemas import API_PREFIX
from api.telemetry import RequestMetrics, Telemetry
from core.db import schema
from core.exports import int8_graph
from core.settings import Settings, get_settings
from core.uploads import sweep_temporaries
from serving import rollout
from serving.cache import ModelCache, RefCache
from serving.dataplane import DataPlane
from serving.drift import DriftMonitor
from serving.explain import Explainers, ExplainOptions
from serving.metrics import WatchMetrics
from serving.process import ServingOptions, check_serving

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API for `settings` (default: the environment's)."""
    settings = settings or get_settings()
    app = FastAPI(
        title="resnet-service",
        summary="Train, evaluate and compare the ResNets of He et al. (2015, 2016).",
        version="0.1.0",
        lifespan=_lifespan,
        # OpenTelemetry stays off (the service exports Prometheus metrics, api.telemetry):
        # FastAPI would otherwise ask the global providers on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.telemetry = Telemetry(settings)
    app.state.watch_metrics = WatchMetrics(app.state.telemetry.registry)  # payloads, drift
    app.state.keys = KeyCache()  # API keys checked a moment ago (api.deps)
    errors.install(app, renderers={inference.PREFIX: inference.render_error})
    uploads = {
        API_PREFIX + datasets.router.prefix: settings.max_upload_bytes,
        predict.PATH: predict.body_limit(settings),
        explain.PATH: explain.body_limit(settings),
    }
    infer_limit = (
        (inference.is_infer, inference.body_limit(settings)),
        (imports.is_import, imports.body_limit(settings)),
    )
    app.add_middleware(
        BodyLimit,
        default=settings.max_request_bytes,
        by_path=uploads,
        by_test=infer_limit,
        idle_s=settings.body_timeout_seconds,
    )
    # Each middleware added wraps those before it: the edge runs before limits and bodies.
    ratelimit.install(app, settings)
    # Right after authentication: a full model queue refuses before routing or bodies.
    ttl_s = settings.predict_ref_ttl_ms / 1000
    owners = settings.reads_owner_only
    app.add_middleware(
        PredictShed,
        path=predict.PATH,
        ttl_s=ttl_s,
        reads_owner_only=owners,
        ref_of=inference.infer_ref,
    )
    edge.install(app, settings, app.state.keys)
    app.add_middleware(RequestMetrics, telemetry=app.state.telemetry)
    app.include_router(_api())
    app.include_router(inference.router)  # the Open Inference Protocol, at /v2
    # The prediction routes, matched before every other, each by one regex: FastAPI
    # resolves a route of an included router by walking every router's routes on each
    # request; these skip that, and their endpoints read the request themselves. Their
    # FastAPI routes (the same path and method, never reached) declare and document them.
    app.router.routes[:0] = hot_routes((API_PREFIX, predict.router), ("", inference.router))
    app.include_router(dashboard.router)
    return app


def _api() -> APIRouter:
    """Every API router, under /api/v1."""
    api = APIRouter(prefix=API_PREFIX)
    # Routes are matched in order: the hot prediction path first.
    for router in (
        predict.router,
        explain.router,
        model_registry.router,
        imports.router,
        exports.router,
        payloads.router,
        payloads.job_payloads,
        jobs.router,
        exports.job_files,
        artifacts.router,
        studies.router,
        zoo.router,
        datasets.router,
        keys.router,
        usage.router,
        workers.router,
        whoami.router,
        health.router,
    ):
        api.include_router(router)
    return api


class Serving(TypedDict):
    """What a running server's requests share (`request.state`): the prediction caches and
    the data plane that serves from them.

    They belong to the event loop that runs the lifespan (their processes' sockets and
    futures do), so they are lifespan state rather than app state.
    """

    model_cache: ModelCache
    refs: RefCache
    plane: DataPlane
    drift: DriftMonitor
    explainers: Explainers


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[Serving]:
    """Check (or migrate) the schema before serving; describe the zoo in the background."""
    await run_in_threadpool(_prepare_schema, app.state.settings)
    # What uploads of a killed API process left (a temporary archive, a partial unpack).
    await run_in_threadpool(sweep_temporaries, app.state.settings)
    settings, metrics = app.state.settings, app.state.telemetry.models
    model_cache = _model_cache(settings, metrics.batch)
    refs = RefCache()
    explainers = Explainers(_explain_options(settings))
    stop = threading.Event()
    warm_up = threading.Thread(target=_warm_up, args=(stop,), name="zoo-warm-up")
    warm_up.start()
    try:
        plane = DataPlane(settings, model_cache, refs, metrics)
        async with (
            grpc.served(app, plane),  # the protocol over gRPC too, if GRPC_PORT
            payloads.watching(app, plane) as drift,  # payload log and drift, off the path
            rollout.shadowing(plane),  # shadow versions' copies, compared off the path
        ):
            yield {
                "model_cache": model_cache,
                "refs": refs,
                "plane": plane,
                "drift": drift,
                "explainers": explainers,
            }
    finally:
        stop.set()  # it ends after the net it is counting (at most a few seconds)
        await run_in_threadpool(warm_up.join)
        await model_cache.close()
        await explainers.close()


def _warm_up(stop: threading.Event) -> None:
    """Describe the zoo, then exempt what start-up built from garbage collection."""
    zoo.warm_up(stop)
    if stop.is_set():
        return
    # Start-up objects (torch, the zoo, the app) live as long as the process. Scanning them
    # took 0.5 s per full collection here (`python -m bench.serving_form`), every 2 s under
    # prediction load: a pause of the event loop that was every request's p99. Frozen,
    # they are never scanned again.
    gc.collect()
    gc.freeze()


def _model_cache(settings: Settings, on_batch: Callable[[str, int], None]) -> ModelCache:
    """The cache of loaded models that the predictions serve from, bounded as configured;
    `on_batch` is told each forward pass's size (the metrics)."""
    options = ServingOptions(
        max_batch=settings.predict_max_batch,
        max_wait_s=settings.predict_max_wait_ms / 1000,
        max_queue=settings.predict_queue_size,
        threads=settings.predict_threads,
        replicas=settings.predict_replicas,
        device=settings.predict_device,
        fold=settings.predict_fold_batch_norm,
        backend=settings.predict_backend,
        precision=settings.predict_precision,
        precision_tolerance=settings.predict_precision_tolerance,
        int8_graph=functools.partial(int8_graph, settings),
    )
    check_serving(options)  # a backend, device or precision that cannot run: refused now
    return ModelCache(
        max_models=settings.predict_cache_models,
        max_bytes=settings.predict_cache_bytes,
        options=options,
        max_starting=settings.predict_max_starting,
        on_batch=on_batch,
    )


def _explain_options(settings: Settings) -> ExplainOptions:
    """How the explain processes are kept and bounded, as configured."""
    return ExplainOptions(
        max_models=settings.explain_cache_models,
        max_running=settings.explain_max_running,
        max_images=settings.explain_max_images,
        threads=settings.explain_threads,
        device=settings.predict_device,
    )


def _prepare_schema(settings: Settings) -> None:
    """Migrate to head in the embedded mode; otherwise refuse an outdated schema."""
    if settings.migrate_on_start:
        schema.upgrade(settings.database_url)
        return
    try:
        schema.check_current(settings.database_url)
    except schema.SchemaOutdated as error:
        log.error("the API will not start: %s", error)
        raise
