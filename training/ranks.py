"""A training process's place among the ranks of one run, and their collectives.

`fit` trains with a `Ranks`: `SingleRank` for a run of one process, whose collectives do
nothing, or `DistributedRanks` when a run spans several processes (`training.distributed`
starts them). Every rank holds the whole net, trains on its part of each global batch and
averages gradients with DistributedDataParallel; rank 0 alone evaluates, reports and writes
checkpoints, and every decision that changes what the ranks do next (stop now, warm-up
over, where to resume from) is rank 0's, broadcast, so that the ranks never diverge.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from training.pipeline import Shard

T = TypeVar("T")

# Ranks agree on rank 0's stop request every this many steps (and at each checkpoint): a
# collective and a host sync per step would cost a GPU run more than ten steps of latency.
STOP_EVERY = 10


class Ranks(Protocol):
    """This process's place in its run, and the collectives the loop meets the others in."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0: the one that evaluates, reports and checkpoints."""
        ...

    @property
    def shard(self) -> Shard | None:
        """This rank's part of every global batch; None: all of it."""
        ...

    def check(self, batch_size: int, train_images: int) -> None:
        """Refuse a global batch that the ranks cannot share evenly."""

    def share(self, value: T) -> T:
        """Rank 0's `value`, on every rank."""
        ...

    def should_stop(self, wish: Callable[[], bool], step: int, checkpointed: bool) -> bool:
        """Whether to stop after `step`: rank 0's `wish`, agreed by all at their stop checks."""
        ...

    def total(self, sums: Tensor) -> Tensor:
        """`sums` summed over the ranks, in place, on every rank."""
        ...

    def barrier(self) -> None:
        """Wait until every rank has come here."""

    def wrap(self, model: nn.Module) -> nn.Module:
        """`model` as this rank trains it (its gradients averaged over the ranks)."""
        ...

    def describe(self, batch_size: int) -> dict[str, Any] | None:
        """How the run is spread over its processes, for its summary; None for one process."""
        ...


@dataclass(frozen=True)
class SingleRank:
    """The only rank of a run of one process: every collective is the identity."""

    rank: int = 0
    world_size: int = 1
    is_main: bool = True
    shard: Shard | None = None

    def check(self, batch_size: int, train_images: int) -> None:
        """Any batch suits one process."""

    def share(self, value: T) -> T:
        return value

    def should_stop(self, wish: Callable[[], bool], step: int, checkpointed: bool) -> bool:
        return wish()

    def total(self, sums: Tensor) -> Tensor:
        return sums

    def barrier(self) -> None:
        """No other rank to wait for."""

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def describe(self, batch_size: int) -> dict[str, Any] | None:
        return None


@dataclass(frozen=True)
class DistributedRanks:
    """This process's rank among `world_size`, in the initialised default process group."""

    rank: int
    world_size: int
    device: torch.device  # where this rank's collectives' tensors live
    backend: str  # the process group's: nccl or gloo

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def shard(self) -> Shard:
        return Shard(self.rank, self.world_size)

    def check(self, batch_size: int, train_images: int) -> None:
        if batch_size % self.world_size:
            raise ValueError(
                f"batch_size {batch_size} does not split evenly over {self.world_size} "
                f"processes; give a multiple of {self.world_size} (the batch is global)"
            )
        if train_images < batch_size:
            raise ValueError(
                f"{train_images} training images are fewer than one global batch of "
                f"{batch_size}: every rank needs its full part of each batch"
            )

    def share(self, value: T) -> T:
        """Rank 0's `value`, on every rank (pickled)."""
        box: list[Any] = [value]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]  # type: ignore[no-any-return]

    def should_stop(self, wish: Callable[[], bool], step: int, checkpointed: bool) -> bool:
        if step % STOP_EVERY and not checkpointed:
            return False
        return self.agree(wish())

    def agree(self, flag: bool) -> bool:
        """Rank 0's `flag`, on every rank."""
        value = torch.tensor([int(flag)], device=self.device)
        dist.broadcast(value, src=0)
        return bool(value.item())

    def total(self, sums: Tensor) -> Tensor:
        dist.all_reduce(sums)
        return sums

    def barrier(self) -> None:
        dist.barrier()

    def wrap(self, model: nn.Module) -> nn.Module:
        """`model` under DistributedDataParallel: gradients averaged over the ranks.

        BatchNorm is not synchronised: each rank normalises with its own part of the
        batch, as multi-GPU training did when the papers were written (2015, Sec. 4.2: a
        mini-batch of 128 on two GPUs), and its running statistics stay its own; rank 0's go
        into checkpoints. Buffers are not broadcast: that would only overwrite the other
        ranks' statistics every step (they are synchronised once, at the start).
        """
        ids = [self.device] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)

    def describe(self, batch_size: int) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "global_batch": batch_size,
            "per_rank_batch": batch_size // self.world_size,
            "batchnorm": "per rank (statistics of each rank's part of the batch, as the papers)",
            "lr_rule": "the recipe's lr applies to the global batch; not scaled by world size",
        }
