"""The micro-batcher and the model cache, without HTTP."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import Tensor

from api.inference import MicroBatcher, ModelCache, Overloaded
from training import checkpoints
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.specs import TrainSpec


def test_concurrent_requests_share_forward_passes() -> None:
    calls: list[int] = []

    def forward(x: Tensor) -> Tensor:
        calls.append(x.shape[0])
        return x.float().sum(dim=(1, 2, 3), keepdim=False)[:, None]

    batcher = MicroBatcher(forward, max_batch=16, max_wait_s=0.05)
    inputs = [torch.full((1, 1, 2, 2), i, dtype=torch.uint8) for i in range(32)]
    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(lambda x: batcher.submit(x).result(timeout=5), inputs))
    batcher.close()
    # Every caller gets its own row back, and fewer forwards ran than requests.
    assert [float(r[0, 0]) for r in results] == [4.0 * i for i in range(32)]
    assert sum(calls) == 32
    assert len(calls) < 32
    assert max(calls) <= 16


def test_batching_off_runs_one_request_per_forward() -> None:
    calls: list[int] = []

    def forward(x: Tensor) -> Tensor:
        calls.append(x.shape[0])
        return x

    batcher = MicroBatcher(forward, max_batch=1)
    for _ in range(5):
        batcher.submit(torch.zeros(1, 1, 1, 1)).result(timeout=5)
    batcher.close()
    assert calls == [1] * 5


def test_a_full_queue_refuses_instead_of_growing() -> None:
    release = threading.Event()

    def slow(x: Tensor) -> Tensor:
        release.wait(5)
        return x

    batcher = MicroBatcher(slow, max_batch=1, max_queue=2)
    first = batcher.submit(torch.zeros(1, 1, 1, 1))  # taken by the thread, blocks in slow()
    while batcher.queue.qsize():
        pass
    batcher.submit(torch.zeros(1, 1, 1, 1))
    batcher.submit(torch.zeros(1, 1, 1, 1))
    with pytest.raises(Overloaded):
        batcher.submit(torch.zeros(1, 1, 1, 1))
    release.set()
    assert first.result(timeout=5).shape == (1, 1, 1, 1)
    batcher.close()


def test_a_failing_forward_fails_only_its_batch() -> None:
    def forward(x: Tensor) -> Tensor:
        if (x == 7).any():
            raise RuntimeError("bad input")
        return x

    batcher = MicroBatcher(forward, max_batch=1)
    with pytest.raises(RuntimeError, match="bad input"):
        batcher.submit(torch.full((1, 1, 1, 1), 7)).result(timeout=5)
    assert batcher.submit(torch.zeros(1, 1, 1, 1)).result(timeout=5).shape == (1, 1, 1, 1)
    batcher.close()


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
        fit(spec, load_dataset(spec.dataset, data_root=root), out_dir=out, sink=RecordingSink())
        path = out / "checkpoints" / "best.pt"
        found.append((path, checkpoints.sha256_of(path)))
    return found


def test_cache_loads_once_and_evicts_the_least_recent(
    two_checkpoints: list[tuple[Path, str]],
) -> None:
    (a, sha_a), (b, sha_b) = two_checkpoints
    cache = ModelCache(max_models=1)
    first = cache.get(a, sha_a)
    assert cache.get(a, sha_a) is first
    assert cache.loads == 1
    cache.get(b, sha_b)
    assert list(cache.entries) == [sha_b]
    assert cache.loads == 2
    probabilities = cache.get(b, sha_b).batcher.submit(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
    assert probabilities.result(timeout=10).shape == (2, 10)
    cache.close()
