"""What a job needs of a worker (`resources` of a job spec), and the queue that carries it.

A job asks for a device and a number of GPUs:

- `cpu`: the CPU, even on a worker that has a GPU;
- `any`: a GPU when its worker has one, else the CPU (needs no GPU: `gpus` is 0);
- `gpu`: `gpus` GPUs (1 or more); only a worker owning that many devices takes it.

Left out, the rule is by compute: a train job over `GPU_DEFAULT_MACS` (forward MACs x batch
x iterations, about 18 hours of a 2-core CPU) asks for one GPU, any other job for `any`.
The paper-scale runs of ResNet-56 and deeper, and ImageNet nets at 224 pixels, need a GPU;
the quick studies and every small run stay runnable on a CPU worker.

Each need has its queue: `cpu` for jobs a CPU may run (of every kind), `gpu` for one GPU,
`gpu-N` for N. A CPU worker consumes `cpu` only; a worker owning K GPUs consumes `cpu`,
`gpu` and `gpu-2` ... `gpu-K`, so a job never reaches a worker that cannot serve it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from training.specs import Spec

Device = Literal["cpu", "gpu", "any"]
MAX_GPUS = 8  # the most GPUs one job may ask for: one machine's
GPU_DEFAULT_MACS = 1e15  # above this a train job asks for a GPU unless it says otherwise
CPU_QUEUE = "cpu"
GPU_QUEUE = "gpu"


class ResourcesSpec(Spec):
    """What a job needs of its worker; what is left out is filled in (`resolve`)."""

    device: Device | None = Field(
        None,
        description="cpu; gpu; any (a GPU when the worker has one, else the CPU). "
        "Default: gpu for a train job over 1e15 MACs, else any.",
    )
    gpus: int | None = Field(
        None,
        ge=0,
        le=MAX_GPUS,
        description="GPUs the job needs: 0 for cpu and any, 1 or more for gpu (default 1).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ResourcesSpec:
        if self.device in ("cpu", "any") and self.gpus:
            raise ValueError(
                f"device {self.device!r} runs on a CPU, so it needs gpus 0, not {self.gpus}; "
                "ask device 'gpu' for GPUs"
            )
        if self.device == "gpu" and self.gpus == 0:
            raise ValueError("device 'gpu' needs gpus of at least 1")
        return self


def resolve(asked: ResourcesSpec, *, macs: float) -> ResourcesSpec:
    """`asked` with its blanks filled: by `gpus` if given, else by the job's compute."""
    if asked.device is not None:
        gpus = asked.gpus if asked.gpus is not None else int(asked.device == "gpu")
        return ResourcesSpec(device=asked.device, gpus=gpus)
    if asked.gpus is not None:
        return ResourcesSpec(device="gpu" if asked.gpus else "any", gpus=asked.gpus)
    if macs > GPU_DEFAULT_MACS:
        return ResourcesSpec(device="gpu", gpus=1)
    return ResourcesSpec(device="any", gpus=0)


def one_device(asked: ResourcesSpec, doing: str) -> ResourcesSpec:
    """`asked` resolved for a job that runs on one device (no MACs known up front);
    `ValueError` when it asks for several GPUs."""
    used = resolve(asked, macs=0)
    if (used.gpus or 0) > 1:
        raise ValueError(f"{doing} runs on one device: gpus must be 0 or 1, not {used.gpus}")
    return used


def queue_for(gpus: int) -> str:
    """The queue of jobs needing `gpus` GPUs."""
    if gpus == 0:
        return CPU_QUEUE
    return GPU_QUEUE if gpus == 1 else f"{GPU_QUEUE}-{gpus}"


ALL_QUEUES = tuple(queue_for(gpus) for gpus in range(MAX_GPUS + 1))


def queues_served(gpus: int) -> list[str]:
    """The queues a worker owning `gpus` GPUs consumes (0: a CPU worker)."""
    return [queue_for(count) for count in range(min(gpus, MAX_GPUS) + 1)]


def of_spec(spec: dict[str, Any]) -> ResourcesSpec:
    """The resources of a stored job spec (one stored before they were kept: `any`, 0)."""
    stored = spec.get("resources") or {}
    return resolve(ResourcesSpec.model_validate(stored), macs=0)


def queue_of(spec: dict[str, Any]) -> str:
    """The queue that carries the job of a stored spec."""
    return queue_for(of_spec(spec).gpus or 0)


def describe(resources: ResourcesSpec) -> str:
    """What a worker needs to take such a job, in words."""
    gpus = resources.gpus or 0
    if gpus == 0:
        return "any worker"
    return "a worker with a GPU" if gpus == 1 else f"a worker owning {gpus} GPUs"
