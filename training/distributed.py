"""One training run on several processes with DistributedDataParallel (torch.distributed).

`train` runs one process per device. The calling process is rank 0: it reports through the
caller's sink and writes the checkpoints exactly as a one-process run does (so the worker's
fenced database sink and its watchdog work unchanged), and it starts ranks 1..N-1 as child
processes of `python -m training.rank_process`. The ranks meet at a TCPStore that rank 0
hosts (on a free port unless one is given) and talk over NCCL on GPUs, one device each, or
gloo on CPUs.

A rank that dies ends the attempt: gloo sees the closed connection at once, every
collective has a timeout (NCCL's backstop), the launcher ends the ranks still running, and
a child dies with its launcher (Linux's parent-death signal). The next attempt resumes from
rank 0's last checkpoint, which every rank loads.

Several hosts (N nodes x M processes) meet the same way: torchrun's MASTER_ADDR,
MASTER_PORT, NNODES and NODE_RANK make the `Rendezvous`; global rank = NODE_RANK x M +
local rank; node 0's launcher is rank 0 and hosts the store.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store, TCPStore  # typed here; torch.distributed re-exports

from training.devices import default_device
from training.events import EventSink, NullSink
from training.loop import TrainingDivergedError
from training.options import RunOptions
from training.ranks import DistributedRanks
from training.specs import TrainSpec
from training.trainer import train_here

# Longest a rank waits in a collective (rank 0 evaluates and checkpoints while the others
# wait), and for the others at the start. A dead rank is noticed sooner: gloo sees its
# connection close, and the launcher sees its exit.
DEFAULT_TIMEOUT_S = 300.0
END_GRACE_S = 5.0  # how long a rank has to exit on SIGTERM before it is killed
SETTLE_S = 2.0  # how long a failed launcher waits to learn which rank died, if one did
ARRIVED = "ranks-arrived"  # the store's count of ranks started by launchers, ready to join


class RankFailedError(RuntimeError):
    """A rank of a distributed run died or failed: the attempt ends."""


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet: torchrun's MASTER_ADDR, MASTER_PORT, NNODES and NODE_RANK."""

    addr: str = "127.0.0.1"
    port: int = 0  # 0: a free port of this host (one host only)
    nnodes: int = 1
    node_rank: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.nnodes > 1 and self.port == 0:
            raise ValueError("a run on several hosts needs a MASTER_PORT that every host uses")


def rank_devices(device: torch.device | None, nproc: int) -> list[torch.device]:
    """One device per local rank: consecutive GPUs from `device`'s index, else the CPU."""
    device = device or default_device()
    if device.type == "cpu":
        return [device] * nproc
    if device.type != "cuda":
        raise ValueError(f"several processes train on cuda or cpu devices, not {device.type}")
    first, count = device.index or 0, torch.cuda.device_count()
    if first + nproc > count:
        raise ValueError(
            f"{nproc} processes need {nproc} GPUs from cuda:{first}; this host has {count}"
        )
    return [torch.device("cuda", first + index) for index in range(nproc)]


def train(
    spec: TrainSpec,
    options: RunOptions,
    sink: EventSink,
    *,
    nproc: int,
    rendezvous: Rendezvous | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Train `spec` on `nproc` processes of this host, one device each; returns the summary.

    `options.device` is the first rank's device. On the host of rank 0 the summary is the
    run's; a rank that fails ends them all with `RankFailedError`.
    """
    meet = rendezvous or Rendezvous()
    devices = rank_devices(options.device, nproc)
    backend = "nccl" if devices[0].type == "cuda" else "gloo"
    world, first = nproc * meet.nnodes, meet.node_rank * nproc
    timeout, threads = timedelta(seconds=timeout_s), _threads_per_rank(devices[0], nproc)
    store = TCPStore(
        meet.addr, meet.port, world, is_master=first == 0, timeout=timeout, wait_for_workers=False
    )
    common = {
        # Only the fields of a train spec: a job spec's extra fields are the service's.
        "spec": spec.model_dump(mode="json", include=set(TrainSpec.model_fields)),
        "options": options.to_json(),
        "addr": meet.addr,
        "port": store.port,
        "world_size": world,
        "backend": backend,
        "timeout_s": timeout_s,
        "threads": threads,
        "parent": os.getpid(),
    }
    children = {
        first + local: _spawn({**common, "rank": first + local, "device": str(devices[local])})
        for local in range(1, nproc)
    }
    own_sink: EventSink = sink if first == 0 else NullSink()
    pids = ", ".join(f"rank {rank} pid {child.pid}" for rank, child in children.items())
    own_sink.on_event("info", f"started {world} ranks on {backend}: rank {first} here, {pids}")
    try:
        with _threads(threads):
            if first > 0:
                store.add(ARRIVED, 1)  # this host's launcher is a rank too
            _await_ranks(store, world, children, timeout_s)
            ranks = _join(store, first, world, devices[0], backend, timeout)
            own = dataclasses.replace(options, device=devices[0])
            summary = train_here(spec, own, own_sink, ranks)
        _wait(children, timeout_s, own_sink)
    except Exception as error:
        failed = _failures(children, settle_s=SETTLE_S)
        # A diverged run ends every rank at once, with its own error.
        if failed and not isinstance(error, TrainingDivergedError):
            raise RankFailedError(
                f"{failed}; the other ranks were ended. The run resumes from its last "
                "checkpoint when started again."
            ) from error
        raise
    finally:
        _end(children)
        if dist.is_initialized():
            dist.destroy_process_group()
    return summary


def _await_ranks(
    store: Store, world: int, children: dict[int, subprocess.Popen[bytes]], timeout_s: float
) -> None:
    """Wait until every rank has reached the store, failing at once if one of ours dies first
    (joining the process group would wait for it until the timeout)."""
    deadline = time.monotonic() + timeout_s
    while store.add(ARRIVED, 0) < world - 1:
        failed = _failures(children)
        if failed:
            raise RankFailedError(f"{failed} before joining the run")
        if time.monotonic() > deadline:
            raise RankFailedError(f"not every rank of {world} arrived within {timeout_s:.0f} s")
        time.sleep(0.05)


def _join(
    store: Store,
    rank: int,
    world: int,
    device: torch.device,
    backend: str,
    timeout: timedelta,
) -> DistributedRanks:
    """Join the run's process group as `rank`, on `device`."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return DistributedRanks(rank, world, device, backend)


def _threads_per_rank(device: torch.device, nproc: int) -> int:
    """CPU threads per rank: the host's cores shared out, so the ranks do not oversubscribe."""
    if device.type == "cuda":
        return torch.get_num_threads()
    return max(1, (os.cpu_count() or 1) // nproc)


@contextmanager
def _threads(count: int) -> Iterator[None]:
    """Use `count` CPU threads in this process for the run, then as many as before."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _spawn(launch: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Start one rank. In a session of its own: a Ctrl-C reaches the launcher, which stops
    the run in step and checkpoints, rather than killing the ranks mid-step."""
    command = [sys.executable, "-m", "training.rank_process", json.dumps(launch)]
    return subprocess.Popen(command, start_new_session=True)


def _wait(children: dict[int, subprocess.Popen[bytes]], timeout_s: float, sink: EventSink) -> None:
    """Wait for the other ranks to exit once the run is over; what they trained is saved."""
    for child in children.values():
        child.wait(timeout_s)
    failed = _failures(children)
    if failed:
        sink.on_event("warning", f"{failed} after the run ended")


def _failures(children: dict[int, subprocess.Popen[bytes]], settle_s: float = 0.0) -> str:
    """Which ranks have exited with an error, and how; empty when none has.

    A rank's death reaches the others (its connections close) before its exit status does:
    with `settle_s`, wait that long for a status before deciding that none failed.
    """
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and all(c.poll() is None for c in children.values()):
        time.sleep(0.05)
    failed = []
    for rank, child in children.items():
        code = child.poll()
        if code is not None and code < 0:
            failed.append(
                f"rank {rank} (pid {child.pid}) was killed by {signal.Signals(-code).name}"
            )
        elif code:
            failed.append(f"rank {rank} (pid {child.pid}) exited with status {code}")
    return "; ".join(failed)


def _end(children: dict[int, subprocess.Popen[bytes]]) -> None:
    """End the ranks still running: SIGTERM, then SIGKILL after a grace."""
    running = [child for child in children.values() if child.poll() is None]
    for child in running:
        child.terminate()
    for child in running:
        try:
            child.wait(END_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def main(argv: list[str]) -> None:
    """Run one rank other than the launcher's, as `train` started it (`training.rank_process`)."""
    launch = json.loads(argv[0])
    device = torch.device(launch["device"])
    torch.set_num_threads(launch["threads"])
    timeout = timedelta(seconds=launch["timeout_s"])
    store = TCPStore(
        launch["addr"], launch["port"], launch["world_size"], is_master=False, timeout=timeout
    )
    store.add(ARRIVED, 1)
    ranks = _join(store, launch["rank"], launch["world_size"], device, launch["backend"], timeout)
    try:
        spec = TrainSpec.model_validate(launch["spec"])
        train_here(spec, RunOptions.from_json(launch["options"], device), NullSink(), ranks)
    finally:
        dist.destroy_process_group()
