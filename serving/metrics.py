"""Serving's Prometheus series: per served model its requests, latencies, batch sizes,
images and errors, in the registry the app gives."""

from __future__ import annotations

from typing import Any

import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DIFF_BUCKETS = (0.0001, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1)
UNRESOLVED = "(unresolved)"  # the model label of a request whose reference did not resolve


class ModelMetrics:
    """Per served model, labelled by the resolved target (`name/version` or a job id, so
    bounded by what is registered, never the reference as sent): prediction requests and
    their errors by status, latencies, the images served and the batch sizes formed.

    Every prediction route (`/api/v1/predict`, the Open Inference Protocol's infer) feeds
    them through `serving.dataplane`; the batch sizes come from the model processes' answers.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        def histogram(name: str, what: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, what, ["model"], buckets=buckets, registry=registry)

        self.request = histogram(
            "resnet_model_request_duration_seconds",
            "Prediction request latency per model, from admission to the answer's status.",
            LATENCY_BUCKETS,
        )
        self.queue = histogram(
            "resnet_model_queue_duration_seconds",
            "Seconds a request's images waited for their forward pass, per model.",
            LATENCY_BUCKETS,
        )
        self.inference = histogram(
            "resnet_model_inference_duration_seconds",
            "Seconds of the forward pass that served a request (its whole batch), per model.",
            LATENCY_BUCKETS,
        )
        self.batch_size = histogram(
            "resnet_model_batch_size",
            "Images per forward pass, per model (tagged by the pass's first request).",
            BATCH_BUCKETS,
        )
        self.images = Counter(
            "resnet_model_images", "Images classified, per model.", ["model"], registry=registry
        )
        self.errors = Counter(
            "resnet_model_errors",
            "Prediction requests answered with an error, per model and status.",
            ["model", "status"],
            registry=registry,
        )
        # Children by label: `labels()` hashes and locks each time, the hot path once.
        self._children: dict[str, tuple[Any, Any, Any, Any, Any]] = {}
        self._rollout_series(registry)

    def _rollout_series(self, registry: CollectorRegistry) -> None:
        """The series of rollouts: requests per version of a weighted alias, and what each
        shadow version's copies showed (`serving.rollout`)."""
        self.rollout = Counter(
            "resnet_rollout_requests",
            "Requests through a weighted alias, per model, alias, version and status.",
            ["model", "alias", "version", "status"],
            registry=registry,
        )
        shadow = ["model", "shadow"]  # the primary's `name/version`, the shadow's
        self.shadow_images = Counter(
            "resnet_shadow_images", "Images a shadow version answered too.", shadow,
            registry=registry,
        )  # fmt: skip
        self.shadow_agreed = Counter(
            "resnet_shadow_top1_agreements",
            "Shadowed images whose top-1 class was the primary's.",
            shadow,
            registry=registry,
        )
        self.shadow_diff = Histogram(
            "resnet_shadow_abs_difference",
            "Per shadowed image, the mean over classes of |p shadow - p primary|.",
            shadow,
            buckets=DIFF_BUCKETS,
            registry=registry,
        )
        self.shadow_latency = Histogram(
            "resnet_shadow_duration_seconds",
            "Seconds from a shadow copy's submission to its answer (the model running).",
            shadow,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.shadow_drops = Counter(
            "resnet_shadow_dropped",
            "Copies for a shadow not compared, per shadow and reason (shadow_busy, "
            "primary_busy, input_differs, classes_differ, failed).",
            ["shadow", "reason"],
            registry=registry,
        )

    def _of(self, model: str) -> tuple[Any, Any, Any, Any, Any]:
        children = self._children.get(model)
        if children is None:
            children = (
                self.request.labels(model),
                self.queue.labels(model),
                self.inference.labels(model),
                self.batch_size.labels(model),
                self.images.labels(model),
            )
            self._children[model] = children
        return children

    def served(self, model: str, images: int, queue_s: float, forward_s: float) -> None:
        """A request's images were classified after `queue_s` waiting and `forward_s`."""
        _, queue, inference, _, counted = self._of(model)
        queue.observe(queue_s)
        inference.observe(forward_s)
        counted.inc(images)

    def batch(self, model: str, size: int) -> None:
        """A forward pass of `size` images ran (its first request for `model`)."""
        self._of(model)[3].observe(size)

    def answered(self, model: str, status: int, seconds: float) -> None:
        """An admitted request was answered with `status` after `seconds`."""
        self._of(model)[0].observe(seconds)
        if status >= 400:
            self.errors.labels(model, str(status)).inc()

    def refused(self, status: int) -> None:
        """A request whose reference did not resolve (or is not the caller's to read)."""
        self.errors.labels(UNRESOLVED, str(status)).inc()

    def rolled_out(self, arm: tuple[str, str, str], status: int) -> None:
        """A request through a weighted alias (model, alias, version) was answered."""
        self.rollout.labels(*arm, str(status)).inc()

    def shadowed(
        self, model: str, shadow: str, agreed: int, diffs: npt.NDArray[Any], seconds: float
    ) -> None:
        """A shadow answered a copy of `len(diffs)` images of `model` in `seconds`."""
        self.shadow_images.labels(model, shadow).inc(len(diffs))
        self.shadow_agreed.labels(model, shadow).inc(agreed)
        observed = self.shadow_diff.labels(model, shadow)
        for diff in diffs.tolist():
            observed.observe(diff)
        self.shadow_latency.labels(model, shadow).observe(seconds)

    def shadow_dropped(self, shadow: str, reason: str) -> None:
        """A copy for `shadow` was not compared, for `reason`."""
        self.shadow_drops.labels(shadow, reason).inc()


class WatchMetrics:
    """What watches served traffic, per served model (labelled as `ModelMetrics` is): the
    payload log's records (written, dropped by its full buffer, lost to the store) and
    segments deleted by its bounds (`serving.payloads`); the drift statistics of the
    model's window of served images (`serving.drift`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, what: str, labels: tuple[str, ...] = ("model",)) -> Counter:
            return Counter(name, what, list(labels), registry=registry)

        def gauge(name: str, what: str, labels: tuple[str, ...] = ("model",)) -> Gauge:
            return Gauge(name, what, list(labels), registry=registry)

        self.logged = counter("resnet_payload_log_records", "Payload records written, per model.")
        self.dropped = counter(
            "resnet_payload_log_dropped",
            "Sampled images not logged because the payload buffer was full, per model.",
        )
        self.lost = counter(
            "resnet_payload_log_lost",
            "Payload records lost, per model: dropped past the bound while the artifact store "
            "refused them, or still refused at a stop.",
        )
        self.deleted = counter(
            "resnet_payload_log_deleted_segments",
            "Payload segments deleted by the bounds, by reason (bytes or age).",
            ("reason",),
        )
        self.window = gauge(
            "resnet_model_drift_window_images", "Served images in the drift window, per model."
        )
        self.mean_shift = gauge(
            "resnet_model_drift_mean_shift",
            "|mean served - mean of the training split| / its std, per model and channel.",
            ("model", "channel"),
        )
        self.std_ratio = gauge(
            "resnet_model_drift_std_ratio",
            "std served / std of the training split, per model and channel.",
            ("model", "channel"),
        )
        self.class_distance = gauge(
            "resnet_model_drift_class_total_variation",
            "Total variation distance of the predicted classes from the reference, per model.",
        )
        self.class_p_value = gauge(
            "resnet_model_drift_class_p_value",
            "Chi-square p-value of the predicted classes against the reference, per model.",
        )
