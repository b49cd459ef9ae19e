"""A ResNet-110 checkpoint: saved to the local disk alone, against saved and put to S3.

The baseline, in the same run: `training.checkpoints.save` of a ResNet-110 (CIFAR-10)
training state (model, SGD momentum, RNG state) into a folder: serialised, hashed, written
atomically with its `.sha256`. Against it: the same save followed by `S3Store.put` to a
moto S3 server on this machine (`tests.services.s3_server`), as a worker with
`ARTIFACT_STORE=s3` does for each checkpoint, and a fetch into an empty download cache (as
a worker that resumes elsewhere, or the API, does). Prints seconds per checkpoint (the
median of `--repeats`) and the ratios.

    .venv/bin/python -m bench.checkpoint_store
    .venv/bin/python -m bench.checkpoint_store --model resnet20 --repeats 3   # quick
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import SecretStr

import models
from core.settings import Settings
from core.storage import S3Store
from tests.services import s3_server
from training import checkpoints


def training_state(name: str) -> dict[str, Any]:
    """A checkpoint's content for `name` on CIFAR-10: weights, momentum buffers, RNG."""
    net = models.build(name, num_classes=10)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()  # the momentum buffers exist once a step was taken
    return {
        "model": net.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": 1,
        "epoch": 0,
        "rng": torch.get_rng_state(),
    }


def median_seconds(action: Callable[[int], None], repeats: int) -> float:
    """The median wall time of `action(i)` over `repeats` runs."""
    times = []
    for index in range(repeats):
        started = time.perf_counter()
        action(index)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet110")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    state = training_state(args.model)
    with tempfile.TemporaryDirectory() as scratch, s3_server() as endpoint:
        root = Path(scratch)
        settings = Settings(
            artifact_store="s3",
            s3_endpoint_url=endpoint,
            s3_bucket="bench",
            s3_access_key_id="bench",
            s3_secret_access_key=SecretStr("bench"),
            artifact_cache_dir=root / "cache",
        )
        store = S3Store(settings)
        store.ensure_bucket()  # once per worker: not a checkpoint's cost

        def local(index: int) -> None:
            checkpoints.save(
                root / f"local-{index}", {**state, "step": index}, is_best=False, keep_last=2
            )

        saved: list[checkpoints.CheckpointInfo] = []

        def stored(index: int) -> None:
            info = checkpoints.save(
                root / f"stored-{index}", {**state, "step": index}, is_best=False, keep_last=2
            )
            store.put(f"jobs/bench/checkpoints/step-{index}.pt", info.path, info.sha256)
            saved.append(info)

        def fetched(index: int) -> None:
            info = saved[index]
            store.cache.root = root / f"cache-{index}"  # empty: a download each time
            store.fetch(f"jobs/bench/checkpoints/step-{index}.pt", info.sha256)

        local_s = median_seconds(local, args.repeats)
        stored_s = median_seconds(stored, args.repeats)
        fetched_s = median_seconds(fetched, args.repeats)
    size = saved[0].bytes
    print(f"{args.model} checkpoint: {size / 2**20:.1f} MiB, median of {args.repeats}")
    print(f"  local save (baseline)     {local_s:8.3f} s")
    print(f"  save + put to S3 (moto)   {stored_s:8.3f} s   ratio {stored_s / local_s:5.2f}x")
    print(f"  fetch into empty cache    {fetched_s:8.3f} s   ratio {fetched_s / local_s:5.2f}x")


if __name__ == "__main__":
    main()
