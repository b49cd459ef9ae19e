"""Time limits from a job's budget: a soft limit the loop obeys, a hard one enforced by force.

Any device the service runs on is assumed to train at least `SLOWEST_MACS_PER_S`
multiply-accumulates per second (the CPU figure is 25x below what two cores reach on
ResNet-20), plus a fixed overhead per step; so a slow device never hits the limit, while a
job that hangs stops holding its GPU long before MAX_JOB_SECONDS.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SLOWEST_MACS_PER_S = {"cpu": 2e9, "cuda": 5e10}
STEP_OVERHEAD_S = 0.05
MIN_LIMIT_S = 600.0
HARD_GRACE_S = 300.0  # after its soft limit the loop has this long to stop by itself


@dataclass(frozen=True)
class TimeLimits:
    """Seconds after which a job is asked to stop (soft) and ended by force (hard)."""

    soft_s: float
    hard_s: float


def ceiling(max_job_seconds: int) -> TimeLimits:
    """The limits of a job whose budget is not known yet: MAX_JOB_SECONDS."""
    return TimeLimits(float(max_job_seconds), max_job_seconds + HARD_GRACE_S)


def time_limits(
    steps: int, macs_per_step: float, device: torch.device, max_job_seconds: int
) -> TimeLimits:
    """Soft and hard limits for `steps` training steps, clamped to `max_job_seconds`."""
    rate = SLOWEST_MACS_PER_S.get(device.type, SLOWEST_MACS_PER_S["cpu"])
    # Forward and backward are about three forward passes; one more covers evaluations.
    estimate = MIN_LIMIT_S + steps * (STEP_OVERHEAD_S + 4 * macs_per_step / rate)
    soft = min(estimate, float(max_job_seconds))
    return TimeLimits(soft, soft + HARD_GRACE_S)
