"""`resnet-service worker --gpus`: GPUs split into worker processes, and their supervision
(signals passed on to every worker; one that exits stops the others warm)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import typer

from cli import server

# A stand-in worker: says which signal ended it, as Celery's warm and cold shutdowns would.
CHILD = """
import signal, sys, time
def stop(number, _):
    open(sys.argv[1], "w").write(signal.Signals(number).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGQUIT, stop)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(int(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


def test_gpus_split_into_groups_and_bad_choices_say_why() -> None:
    assert server.gpu_groups("all", 1, 2) == [[0], [1]]
    assert server.gpu_groups("1,3", 1, 4) == [[1], [3]]
    assert server.gpu_groups("all", 2, 4) == [[0, 1], [2, 3]]
    refusals = {
        ("all", 1, 0): "no GPU is visible on this machine",
        ("0,1", 1, 1): r"below 1 \(the GPUs visible here\), not 0,1",
        ("0,0", 1, 2): "must be distinct",
        ("x", 1, 2): "neither all nor GPU ids",
        ("all", 2, 3): "3 GPUs do not split into groups of 2",
    }
    for (gpus, per_worker, visible), message in refusals.items():
        with pytest.raises(typer.BadParameter, match=message):
            server.gpu_groups(gpus, per_worker, visible)


def test_the_worker_arguments_name_the_queues_served() -> None:
    argv = server.worker_argv("w@h", "INFO", ["train", "gpu", "gpu-2"])
    assert "--queues=train,gpu,gpu-2" in argv
    assert "--queues=train" in server.worker_argv("w@h", "INFO")


def _children(tmp_path: Path, *plans: tuple[int, int]) -> dict[str, subprocess.Popen[bytes]]:
    """Stand-in workers: each (seconds to live, exit status)."""
    started = {}
    for index, (seconds, status) in enumerate(plans):
        note = tmp_path / f"w{index}"
        args = [sys.executable, "-c", CHILD, str(note), str(seconds), str(status)]
        started[f"w{index}"] = subprocess.Popen(args, start_new_session=True)
        deadline = time.monotonic() + 30
        while not Path(f"{note}.ready").exists():
            assert time.monotonic() < deadline, "a stand-in worker did not start"
            time.sleep(0.05)
    return started


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT])
def test_a_signal_to_the_supervisor_reaches_every_worker(
    tmp_path: Path, sig: signal.Signals
) -> None:
    children = _children(tmp_path, (60, 0), (60, 0))
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT)}
    timer = threading.Timer(0.5, lambda: signal.raise_signal(sig))
    timer.start()
    try:
        assert server.watch_workers(children) == 0
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert [(tmp_path / f"w{i}").read_text() for i in range(2)] == [sig.name] * 2


def test_a_worker_that_fails_stops_the_others_warm(tmp_path: Path) -> None:
    children = _children(tmp_path, (0, 3), (60, 0))
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT)}
    try:
        assert server.watch_workers(children) == 1
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert (tmp_path / "w1").read_text() == "SIGTERM"
