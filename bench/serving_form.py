"""Forward images/s of a net's serving form against the eager net, and what the CPU costs.

All on CPU, in this process, each figure against a baseline measured in the same run:

1. the eager net (eval mode, `torch.inference_mode()`) and its serving form
   (`training.predictor.serving_form`) at one batch size, on 1 and 2 intra-op threads;
2. the same with one core kept busy by another process (a Python loop pinned to it);
3. the eager net at batch 20 on one intra-op thread, alone and next to a busy Python
   thread of this process (it waits for the GIL after every layer);
4. one full `gc.collect()` once the API is imported and created and the zoo described, as
   at the API's start-up, before and after `gc.freeze()`.

Rates are the best of a few rounds: the figure least disturbed by whatever else shares
the CPU.

    .venv/bin/python -m bench.serving_form
    .venv/bin/python -m bench.serving_form --model resnet56 --batch-size 64 --seconds 1
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event

import torch
from torch import Tensor, nn

import models
from training.predictor import serving_form

THREADS = (1, 2)
GIL_BATCH = 20


def rate(net: nn.Module, x: Tensor, seconds: float, rounds: int = 3) -> float:
    """Images/s of `net` on `x` under inference mode, best of `rounds`."""
    with torch.inference_mode():
        net(x)  # warm-up: the first pass allocates
        best = float("inf")
        for _ in range(rounds):
            count, started = 0, time.perf_counter()
            while count == 0 or time.perf_counter() - started < seconds:
                net(x)
                count += 1
            best = min(best, (time.perf_counter() - started) / count)
    return x.shape[0] / best


def nets(name: str, batch: int) -> dict[str, tuple[nn.Module, Tensor]]:
    """The eager net and its serving form, each with a normalised batch in its layout."""
    torch.manual_seed(0)
    eager = models.build(name).eval()
    x = torch.randn(batch, 3, 32, 32)
    return {
        "eager": (eager, x),
        "serving": (serving_form(eager), x.contiguous(memory_format=torch.channels_last)),
    }


def table(
    title: str, candidates: dict[str, tuple[nn.Module, Tensor]], seconds: float
) -> dict[tuple[str, int], float]:
    """Images/s of each net on each thread count, printed with serving/eager ratios."""
    print(f"\n{title}")
    print(f"{'threads':>7}{'eager img/s':>13}{'serving img/s':>15}{'ratio':>7}")
    rates = {}
    for threads in THREADS:
        torch.set_num_threads(threads)
        for label, (net, x) in candidates.items():
            rates[label, threads] = rate(net, x, seconds)
        eager, serving = rates["eager", threads], rates["serving", threads]
        print(f"{threads:>7}{eager:>13.0f}{serving:>15.0f}{serving / eager:>7.2f}")
    return rates


def _spin(core: int, ready: Event) -> None:
    os.sched_setaffinity(0, {core})
    ready.set()
    while True:
        pass


@contextmanager
def busy_core() -> Iterator[int]:
    """One core (the last this process may use) kept busy by another process."""
    core = max(os.sched_getaffinity(0))
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    spinner = context.Process(target=_spin, args=(core, ready), daemon=True)
    spinner.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the busy process did not start within 60 s")
        yield core
    finally:
        spinner.terminate()
        spinner.join()


@contextmanager
def busy_thread() -> Iterator[None]:
    """A Python thread of this process spinning, holding the GIL whenever it runs."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, name="busy")
    spinner.start()
    try:
        yield
    finally:
        stop.set()
        spinner.join()


def gil_cost(name: str, seconds: float) -> tuple[float, float]:
    """ms per eager forward at batch 20 on one thread: alone, and next to a busy thread."""
    torch.set_num_threads(1)
    net, x = nets(name, GIL_BATCH)["eager"]
    alone = GIL_BATCH / rate(net, x, seconds) * 1000
    with busy_thread():
        shared = GIL_BATCH / rate(net, x, seconds, rounds=1) * 1000
    return alone, shared


def collection_ms() -> float:
    """The time of one full garbage collection, in milliseconds."""
    started = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - started) * 1000


def gc_cost() -> tuple[float, float]:
    """A full collection's ms once the API is up, before and after `gc.freeze()`."""
    # Imported here: what start-up loads, and the busy core's process need not import it.
    from api.app import create_app
    from api.routers import zoo

    create_app()
    zoo.warm_up(threading.Event())
    gc.collect()
    before = min(collection_ms() for _ in range(3))
    gc.freeze()
    after = min(collection_ms() for _ in range(3))
    gc.unfreeze()
    return before, after


def print_ratio(label: str, base: float, other: float, unit: Callable[[float], str]) -> None:
    """One line: a baseline, another figure and their ratio."""
    print(f"{label:<48}{unit(base):>10}{unit(other):>10}{other / base:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=0.5, help="Per timed round.")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {len(os.sched_getaffinity(0))} cores, {args.model}")
    candidates = nets(args.model, args.batch_size)
    idle = table(f"batch {args.batch_size}", candidates, args.seconds)
    with busy_core() as core:
        title = f"batch {args.batch_size}, core {core} kept busy by a second process"
        busy = table(title, candidates, args.seconds)
    alone, shared = gil_cost(args.model, args.seconds)
    before, after = gc_cost()

    print(f"\n{'':<48}{'base':>10}{'other':>10}{'ratio':>8}")
    per_s = "{:.0f}/s".format
    for net in candidates:
        print_ratio(f"{net}, 1 thread: core free -> busy", idle[net, 1], busy[net, 1], per_s)
        print_ratio(f"{net}, core busy: 1 thread -> 2", busy[net, 1], busy[net, 2], per_s)
    ms = "{:.1f} ms".format
    label = f"eager batch {GIL_BATCH} forward: alone -> busy thread"
    print_ratio(label, alone, shared, ms)
    print_ratio("full gc.collect() after start-up: -> frozen", before, after, ms)
    # Other processes on these cores skew every figure above: say how busy it was.
    print(f"\nload average (1 min) at start {load_before:.2f}, at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
