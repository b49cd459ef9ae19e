"""Model processes, their micro-batching and the model cache, without HTTP.

The batching rule is tested on the model's end of a socket pair; the processes are real
`python -m serving.process` children serving ResNet-8 checkpoints.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import torch

from serving.cache import ModelCache
from serving.memo import SingleFlight
from serving.process import (
    Closed,
    ForwardError,
    ModelProcess,
    Overloaded,
    Replicas,
    ServingOptions,
    _Channel,
    _frame,
    gather,
)
from training import checkpoints, export
from training.checkpoints import CheckpointError
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
from training.predictor import Predictor
from training.specs import TrainSpec

T = TypeVar("T")


def run(coroutine: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await coroutine()

    return asyncio.run(main())


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
    """Poll `condition` on the event loop until it holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:.0f} s"
        await asyncio.sleep(0.01)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, _Channel]]:
    """The API's end of a socket pair, and the model's end as a channel."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        yield ours, _Channel(theirs)


def images(count: int, value: int = 0) -> np.ndarray:
    return np.full((count, 3, 8, 8), value, dtype=np.uint8)


def test_a_batch_takes_what_is_waiting_up_to_max_batch(
    pair: tuple[socket.socket, _Channel],
) -> None:
    ours, channel = pair
    for request in range(5):
        ours.sendall(_frame((request, images(2))))
    batch, ended = gather(channel, max_batch=6, max_wait_s=0)
    assert [request for request, _ in batch] == [0, 1, 2]  # 6 images; a request is not split
    assert not ended
    batch, _ = gather(channel, max_batch=6, max_wait_s=0)
    assert [request for request, _ in batch] == [3, 4]


def test_batching_off_takes_one_request_per_forward(pair: tuple[socket.socket, _Channel]) -> None:
    ours, channel = pair
    for request in range(3):
        ours.sendall(_frame((request, images(1))))
    sizes = [len(gather(channel, max_batch=1, max_wait_s=0.05)[0]) for _ in range(3)]
    assert sizes == [1, 1, 1]


def test_a_batch_waits_for_late_requests_only_up_to_max_wait(
    pair: tuple[socket.socket, _Channel],
) -> None:
    ours, channel = pair
    ours.sendall(_frame((0, images(1))))
    late = threading.Timer(0.05, lambda: ours.sendall(_frame((1, images(1)))))
    late.start()
    batch, _ = gather(channel, max_batch=8, max_wait_s=2.0)
    assert [request for request, _ in batch] == [0, 1]  # the late one joined
    ours.sendall(_frame((2, images(1))))
    batch, _ = gather(channel, max_batch=8, max_wait_s=0.01)
    assert [request for request, _ in batch] == [2]  # nothing else came: no hang


def test_the_end_of_input_ends_the_batch_loop(pair: tuple[socket.socket, _Channel]) -> None:
    ours, channel = pair
    ours.sendall(_frame((0, images(1))))
    ours.shutdown(socket.SHUT_WR)
    batch, ended = gather(channel, max_batch=8, max_wait_s=1.0)
    assert [request for request, _ in batch] == [0]
    assert ended  # what was sent is still answered, then the process exits


def test_single_flight_computes_once_for_concurrent_callers() -> None:
    calls = 0

    async def compute() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return 42

    async def main() -> list[int]:
        flight: SingleFlight[int] = SingleFlight()
        return await asyncio.gather(*(flight.run("k", compute) for _ in range(10)))

    assert run(main) == [42] * 10
    assert calls == 1


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("runs")
    found = []
    for seed in (0, 1):
        spec = TrainSpec.model_validate(
            {
                "model": {"name": "resnet8"},
                "dataset": {"name": "synthetic", "image_size": 8, "train_size": 32, "test_size": 8},
                "recipe": {"iterations": 1, "batch_size": 16, "seed": seed},
            }
        )
        out = root / str(seed)
        data = load_dataset(spec.dataset, data_root=root)
        fit(spec, data, RunOptions(out_dir=out), RecordingSink())
        path = out / "checkpoints" / "best.pt"
        found.append((path, checkpoints.sha256_of(path)))
    return found


def test_a_model_process_answers_as_the_model_does_in_process(
    two_checkpoints: list[tuple[Path, str]],
) -> None:
    path, sha256 = two_checkpoints[0]
    batch = np.random.default_rng(0).integers(0, 256, (5, 3, 8, 8), dtype=np.uint8)

    async def main() -> tuple[np.ndarray, list[np.ndarray], dict[int, int]]:
        served = await ModelProcess.start(path, sha256, ServingOptions(max_wait_s=0.2))
        try:
            whole = await served.predict(batch)
            # Five concurrent requests: the first waits 0.2 s for others, all share a pass.
            rows = await asyncio.gather(*(served.predict(batch[i : i + 1]) for i in range(5)))
            return whole, rows, dict(served.batch_sizes)
        finally:
            await served.close()

    whole, rows, sizes = run(main)
    # The process serves the serving form (ServingOptions.fold), batch norms folded.
    predictor = Predictor(path, sha256=sha256, fold=True)
    expected = predictor.probabilities(torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(whole, expected, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(rows), expected, atol=1e-6)
    assert sizes == {5: 2}, "the five single-image requests shared one forward pass"


def test_without_folding_a_model_process_answers_bit_for_bit_as_the_eager_net(
    two_checkpoints: list[tuple[Path, str]],
) -> None:
    path, sha256 = two_checkpoints[0]
    batch = np.random.default_rng(1).integers(0, 256, (3, 3, 8, 8), dtype=np.uint8)

    async def main() -> np.ndarray:
        served = await ModelProcess.start(path, sha256, ServingOptions(fold=False, threads=1))
        try:
            return await served.predict(batch)
        finally:
            await served.close()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same kernels as the process's one thread
    try:
        expected = Predictor(path, sha256=sha256).probabilities(torch.from_numpy(batch))
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(run(main), expected.numpy())


def test_a_checkpoint_that_fails_its_check_starts_no_process(
    two_checkpoints: list[tuple[Path, str]],
) -> None:
    path, _ = two_checkpoints[0]
    with pytest.raises(CheckpointError, match="sha256"):
        run(lambda: ModelProcess.start(path, "0" * 64, ServingOptions()))


def test_a_failing_batch_fails_only_its_requests(two_checkpoints: list[tuple[Path, str]]) -> None:
    path, sha256 = two_checkpoints[0]

    async def main() -> np.ndarray:
        served = await ModelProcess.start(path, sha256, ServingOptions())
        try:
            with pytest.raises(ForwardError, match="RuntimeError"):
                await served.predict(np.zeros((1, 5, 8, 8), dtype=np.uint8))  # 5 channels
            return await served.predict(images(2))
        finally:
            await served.close()

    assert run(main).shape == (2, 10)


def test_a_full_queue_refuses_instead_of_growing(two_checkpoints: list[tuple[Path, str]]) -> None:
    path, sha256 = two_checkpoints[0]

    async def main() -> list[object]:
        served = await ModelProcess.start(path, sha256, ServingOptions(max_queue=2))
        try:
            calls = [served.predict(images(1)) for _ in range(3)]
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await served.close()

    first, second, third = run(main)
    assert isinstance(first, np.ndarray)
    assert isinstance(second, np.ndarray)
    assert isinstance(third, Overloaded)


def test_a_cancelled_request_does_not_disturb_the_others(
    two_checkpoints: list[tuple[Path, str]],
) -> None:
    path, sha256 = two_checkpoints[0]

    async def main() -> np.ndarray:
        served = await ModelProcess.start(path, sha256, ServingOptions(max_wait_s=0.1))
        try:
            gone = asyncio.ensure_future(served.predict(images(1)))
            kept = asyncio.ensure_future(served.predict(images(1, 9)))
            await asyncio.sleep(0)
            gone.cancel()  # its client went away while it waited
            answer = await kept
            assert not served.pending
            return answer
        finally:
            await served.close()

    assert run(main).shape == (1, 10)


def test_cache_loads_once_and_evicts_the_least_recent(
    two_checkpoints: list[tuple[Path, str]],
) -> None:
    (a, sha_a), (b, sha_b) = two_checkpoints

    async def main() -> None:
        cache = ModelCache(max_models=1)
        try:
            first = await asyncio.gather(*(cache.get(a, sha_a) for _ in range(5)))
            assert len({id(served) for served in first}) == 1  # one start for five callers
            assert await cache.get(a, sha_a) is first[0]
            assert cache.loads == 1
            await cache.get(b, sha_b)
            assert list(cache.entries) == [sha_b]
            assert cache.loads == 2
            await asyncio.wait(set(cache.stopping))
            assert first[0].processes[0].process.returncode == 0  # a's process exited
            probabilities = await cache.entries[sha_b].predict(images(2))
            assert probabilities.shape == (2, 10)
        finally:
            await cache.close()

    run(main)


def test_a_stopped_process_fails_its_requests_and_is_started_again(
    two_checkpoints: list[tuple[Path, str]],
) -> None:
    path, sha256 = two_checkpoints[0]

    async def main() -> None:
        cache = ModelCache(options=ServingOptions(max_wait_s=1.0))
        try:
            served = await cache.get(path, sha256)
            waiting = asyncio.ensure_future(served.predict(images(1)))  # held 1 s for company
            await until(lambda: served.pending == 1, "the request to be sent")
            os.kill(served.processes[0].process.pid, signal.SIGKILL)
            with pytest.raises(Closed, match="stopped"):
                await waiting
            assert cache.peek(sha256) is None
            again = await cache.get(path, sha256)
            assert again is not served
            assert cache.loads == 2
            assert (await again.predict(images(1))).shape == (1, 10)
        finally:
            await cache.close()

    run(main)


def test_replicas_share_the_requests(two_checkpoints: list[tuple[Path, str]]) -> None:
    path, sha256 = two_checkpoints[0]

    async def main() -> list[int]:
        served = await Replicas.start(path, sha256, ServingOptions(replicas=2, max_wait_s=0.2))
        try:
            await asyncio.gather(served.predict(images(1)), served.predict(images(1)))
            return [sum(process.batch_sizes.values()) for process in served.processes]
        finally:
            await served.close()

    assert run(main) == [1, 1]  # the second request went to the idle process


def test_the_onnxruntime_backend_serves_torchs_probabilities_within_the_bound(
    two_checkpoints: list[tuple[Path, str]],
) -> None:
    # The CPU's default backend (PREDICT_BACKEND=auto), end to end through its process.
    path, sha256 = two_checkpoints[0]
    batch = np.random.default_rng(2).integers(0, 256, (5, 3, 8, 8), dtype=np.uint8)

    async def main() -> np.ndarray:
        options = ServingOptions(threads=1, backend="onnxruntime")
        served = await ModelProcess.start(path, sha256, options)
        try:
            return await served.predict(batch)
        finally:
            await served.close()

    expected = Predictor(path, sha256=sha256, fold=True).probabilities(torch.from_numpy(batch))
    assert np.abs(run(main) - expected.numpy()).max() <= export.TOLERANCE
