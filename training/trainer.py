"""Train a spec in this process: the whole of a one-process run, or one rank of a
distributed one (`training.distributed` starts the others)."""

from __future__ import annotations

import json
import math
from typing import Any

from training.data import LoadedDataset
from training.datasets import load_dataset
from training.events import EventSink
from training.loop import SINGLE_RANK, fit
from training.options import RunOptions
from training.ranks import Ranks
from training.specs import TrainSpec


def train_here(
    spec: TrainSpec, options: RunOptions, sink: EventSink, ranks: Ranks = SINGLE_RANK
) -> dict[str, Any]:
    """Load the spec's dataset, train, and write `spec.json` and `summary.json` (rank 0).

    `spec.json` is the spec as used, defaults resolved (`fit` writes it). The summary's
    non-finite numbers are None, as JSON has no NaN.
    """
    spec = _spec_of_rank_0(spec, ranks)
    options.out_dir.mkdir(parents=True, exist_ok=True)
    data = _load(spec, options, ranks)
    if options.prepare is not None and ranks.is_main:
        options.prepare(data)
    summary: dict[str, Any] = json_safe(fit(spec, data, options, sink, ranks))
    if ranks.is_main:
        (options.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _spec_of_rank_0(spec: TrainSpec, ranks: Ranks) -> TrainSpec:
    """Rank 0's spec, on every rank: ranks that trained specs of their own (another host
    given other options) would wait on each other's collectives until the timeout."""
    if ranks.is_main:
        ranks.share(spec.model_dump(mode="json", include=set(TrainSpec.model_fields)))
        return spec
    return TrainSpec.model_validate(ranks.share(None))


def _load(spec: TrainSpec, options: RunOptions, ranks: Ranks) -> LoadedDataset:
    """The spec's dataset; rank 0 downloads it, if it may, before the other ranks read it."""
    root = options.data_root
    if not options.download:
        return load_dataset(spec.dataset, data_root=root)
    data = load_dataset(spec.dataset, data_root=root, download=True) if ranks.is_main else None
    ranks.barrier()
    return data or load_dataset(spec.dataset, data_root=root)


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value
