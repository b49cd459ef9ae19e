"""One run on several CPU processes (gloo): the same updates as one process, stops agreed by
every rank, two hosts at one rendezvous, and ranks that die.

Each rank normalises BatchNorm with its own half of the batch (as the papers' multi-GPU
runs did), so two ranks do not train the same weights as one process that normalises the
whole batch at once. They must match one process that runs the same global batch as the
same two halves, each normalised alone, with the loss averaged over the halves: that is
the reference here. Only float summation order differs (DDP sums the two halves'
gradients where autograd sums them in one backward), so the parameters agree to
`TOLERANCE` after `STEPS` SGD steps; one process normalising the whole batch differs by
far more.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from training import checkpoints, distributed, runs
from training.datasets import load_dataset
from training.distributed import RankFailedError, Rendezvous
from training.events import RecordingSink
from training.loop import _augmentation, build_model, fit
from training.options import RunOptions
from training.pipeline import make_batches
from training.ranks import STOP_EVERY
from training.recipe import learning_rate, make_optimizer, set_lr
from training.specs import TrainSpec

STEPS = 3
TOLERANCE = 1e-5  # float32 parameters of order 0.1-1, summed in another order: ~1e-7 apart
KILL_WITHIN_S = 10.0  # gloo sees the dead rank's connection close at once; not the 60 s timeout


def _spec(**recipe: Any) -> TrainSpec:
    return TrainSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {
                "name": "synthetic",
                "image_size": 8,
                "train_size": 64,
                "test_size": 16,
                "validation": 0,
            },
            "recipe": {"batch_size": 16, "log_every": 1, "checkpoint_every": 4, **recipe},
        }
    )


def _parameters(state: dict[str, torch.Tensor], names: set[str]) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in state.items() if name in names}


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[name] - b[name]).abs().max().item() for name in a)


def _halves_reference(spec: TrainSpec, root: Path) -> dict[str, torch.Tensor]:
    """The weights after `STEPS` steps of one process that normalises each half alone."""
    recipe, data = spec.recipe, load_dataset(spec.dataset, data_root=root)
    torch.manual_seed(recipe.seed)
    model = build_model(spec.model, data.info)
    memory_format = torch.channels_last if recipe.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    optimizer = make_optimizer(recipe, model)
    batches = make_batches(
        data.train,
        data.info,
        batch_size=recipe.batch_size,
        device=torch.device("cpu"),
        augment=_augmentation(spec, data.info),
        shuffle=True,
        drop_last=True,
        seed=recipe.seed,
        channels_last=bool(recipe.channels_last),
    )
    for step, (x, y) in zip(range(STEPS), batches.epoch(0), strict=False):
        set_lr(optimizer, learning_rate(recipe, step, STEPS, warming_up=False))
        halves = zip(x.tensor_split(2), y.tensor_split(2), strict=True)
        loss = sum(F.cross_entropy(model(xs), ys) for xs, ys in halves) / 2
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[union-attr]
        optimizer.step()
    return {name: parameter.detach() for name, parameter in model.named_parameters()}


def test_two_ranks_train_the_weights_of_one_process_with_per_rank_batchnorm(
    tmp_path: Path,
) -> None:
    spec = _spec(iterations=STEPS)
    summary = runs.train(
        spec, RunOptions(out_dir=tmp_path / "two", data_root=tmp_path), RecordingSink(), nproc=2
    )
    assert summary["distributed"]["per_rank_batch"] == 8
    assert summary["steps"] == STEPS
    # The spec as the run used it (its memory format resolved for the CPU) drives the reference.
    used = TrainSpec.model_validate_json((tmp_path / "two" / "spec.json").read_text())
    reference = _halves_reference(used, tmp_path)
    two = _parameters(
        checkpoints.load(tmp_path / "two" / "checkpoints" / f"step-{STEPS}.pt")["model"],
        set(reference),
    )
    one_sink = RecordingSink()
    fit(
        spec,
        load_dataset(spec.dataset, data_root=tmp_path),
        RunOptions(out_dir=tmp_path / "one"),
        one_sink,
    )
    one = _parameters(
        checkpoints.load(tmp_path / "one" / "checkpoints" / f"step-{STEPS}.pt")["model"],
        set(reference),
    )

    to_reference, to_one = _max_difference(two, reference), _max_difference(two, one)
    print(f"after {STEPS} steps, max |two ranks - halves normalised alone| = {to_reference:.2e}")
    print(f"after {STEPS} steps, max |two ranks - whole batch normalised| = {to_one:.2e}")
    assert to_reference <= TOLERANCE
    assert to_one > 100 * TOLERANCE


@dataclass
class KillingSink(RecordingSink):
    """Kills rank 1 with SIGKILL once rank 0 has finished step `kill_at`."""

    kill_at: int = 0
    killed_at: float | None = None

    def on_progress(self, step: int, total: int) -> None:
        super().on_progress(step, total)
        if step == self.kill_at and self.killed_at is None:
            os.kill(self.pid_of_rank(1), signal.SIGKILL)
            self.killed_at = time.monotonic()

    def pid_of_rank(self, rank: int) -> int:
        started = " ".join(message for _, message in self.events)
        found = re.search(rf"rank {rank} pid (\d+)", started)
        assert found is not None, self.events
        return int(found.group(1))


def test_a_killed_rank_ends_the_attempt_and_the_run_resumes_on_its_step_axis(
    tmp_path: Path,
) -> None:
    spec, out = _spec(iterations=12), tmp_path / "run"
    killer = KillingSink(kill_at=6)
    with pytest.raises(RankFailedError, match=r"rank 1 .* was killed by SIGKILL"):
        runs.train(spec, RunOptions(out_dir=out, data_root=tmp_path), killer, nproc=2)
    assert killer.killed_at is not None
    ended_after = time.monotonic() - killer.killed_at
    print(f"the attempt ended {ended_after:.2f} s after rank 1 was killed at step 6")
    assert ended_after < KILL_WITHIN_S
    with pytest.raises(ProcessLookupError):
        os.kill(killer.pid_of_rank(1), 0)  # reaped, not left behind
    assert checkpoints.latest(out / checkpoints.DIRECTORY) == out / "checkpoints" / "step-4.pt"

    resumed = RecordingSink()
    summary = runs.train(spec, RunOptions(out_dir=out, data_root=tmp_path), resumed, nproc=2)
    assert ("info", "resumed from step-4.pt at step 4") in resumed.events
    assert summary["steps"] == 12
    assert not summary["stopped"]
    assert [step for step, _ in resumed.series("train/loss")] == list(range(5, 13))
    assert checkpoints.latest(out / checkpoints.DIRECTORY) == out / "checkpoints" / "step-12.pt"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_ranks_on_two_hosts_train_node_0s_spec_and_stop_together(tmp_path: Path) -> None:
    """Node 1 is `resnet-service train --nnodes 2 --node-rank 1`; node 0 is this process.

    Node 1 is given another budget and log cadence: it trains node 0's spec all the same,
    or their collectives would not pair up. A stop request after step 2 is agreed at the
    first stop check, step 10, by every rank.
    """
    spec, port = _spec(iterations=30, checkpoint_every=20, log_every=4), _free_port()
    node_1 = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "resnet-service"),
            "train",
            *("--model", "resnet8", "--dataset", "synthetic", "--iterations", "4"),
            *("-d", "image_size=8", "-d", "train_size=64", "-d", "test_size=16"),
            *("-d", "validation=0", "-r", "batch_size=16"),
            *("--device", "cpu", "--out", str(tmp_path / "node-1")),
            *("--nnodes", "2", "--node-rank", "1", "--master-port", str(port)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        summary = distributed.train(
            spec,
            RunOptions(out_dir=tmp_path / "node-0", data_root=tmp_path, device=torch.device("cpu")),
            RecordingSink(stop_at=2),
            nproc=1,
            rendezvous=Rendezvous("127.0.0.1", port, nnodes=2, node_rank=0),
        )
        output, _ = node_1.communicate(timeout=120)
    finally:
        node_1.kill()
    assert node_1.returncode == 0, output.decode(errors="replace")
    assert summary["distributed"]["world_size"] == 2
    assert summary["distributed"]["per_rank_batch"] == 8
    assert summary["stopped"]
    assert summary["steps"] == STOP_EVERY
    saved = checkpoints.load(tmp_path / "node-0" / "checkpoints" / f"step-{STOP_EVERY}.pt")
    # Both ranks' running sums since the last log (steps 9 and 10), in rank 0's checkpoint.
    assert saved["loop"]["window"][2] == 2 * spec.recipe.batch_size
    assert not (tmp_path / "node-1" / "checkpoints").exists()  # rank 0 alone writes them


def test_a_rank_that_dies_before_joining_ends_the_attempt_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_launch: dict[str, Any]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])

    monkeypatch.setattr(distributed, "_spawn", broken)
    started = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 \(pid \d+\) exited with status 3"):
        runs.train(
            _spec(iterations=4),
            RunOptions(out_dir=tmp_path, data_root=tmp_path),
            RecordingSink(),
            nproc=2,
        )
    assert time.monotonic() - started < KILL_WITHIN_S  # not the rendezvous' 300 s


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    """kill -9 of rank 0's process (a worker's watchdog ends a stuck job so) ends the others."""
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "resnet-service"),
            "train",
            *("--model", "resnet8", "--dataset", "synthetic", "--iterations", "100000"),
            *("-d", "image_size=8", "-d", "train_size=64", "-d", "validation=0"),
            *("-r", "batch_size=16", "--device", "cpu", "--nproc", "2", "--out", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"rank 1 pid (\d+)", _read(out / "events.log"))):
            assert launcher.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.1)
        rank_1 = int(found.group(1))
        assert _alive(rank_1)
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + KILL_WITHIN_S
    while _alive(rank_1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(rank_1)


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""
