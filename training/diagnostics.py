"""The papers' own lenses on a training net, per residual unit, in forward order.

- Response std (2015 Fig. 7): the standard deviation of each unit's residual branch
  output (its last BN, before the addition), read at the `branch_out` tap. Measured on the
  training batch of the diagnostic step, so BN is in training mode.
- Gradient norm at each unit's input (2016 Sec. 2-4: how the backward signal reaches
  shallow units).

Plain nets report the same per unit. Values stay on the device until `read`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from models import ResNet


class BlockProbe:
    """Hooks every residual unit of a net for one training step at a time."""

    def __init__(self, model: ResNet) -> None:
        self.units = model.units()
        self.response_std: list[Tensor | None] = []
        self.grad_norm: list[Tensor | None] = []

    @contextmanager
    def capture(self, enabled: bool = True) -> Iterator[None]:
        """Record response std and input-gradient norm during the forward/backward inside."""
        if not enabled:
            yield
            return
        self.response_std = [None] * len(self.units)
        self.grad_norm = [None] * len(self.units)
        handles: list[RemovableHandle] = []
        for index, unit in enumerate(self.units):
            handles.append(unit.branch_out.register_forward_hook(self._response_hook(index)))
            handles.append(unit.register_forward_pre_hook(self._input_hook(index)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _response_hook(self, index: int) -> Any:
        def hook(_module: nn.Module, _inputs: Any, output: Tensor) -> None:
            self.response_std[index] = output.detach().float().std()

        return hook

    def _input_hook(self, index: int) -> Any:
        def record(grad: Tensor) -> None:
            self.grad_norm[index] = grad.detach().float().norm()

        def hook(_module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            if inputs[0].requires_grad:
                inputs[0].register_hook(record)

        return hook

    def read(self) -> dict[str, float]:
        """The last capture as metrics `diag/response_std/{i}` and `diag/grad_norm/{i}`."""
        values: dict[str, float] = {}
        for kind, tensors in (("response_std", self.response_std), ("grad_norm", self.grad_norm)):
            present = [(i, t) for i, t in enumerate(tensors) if t is not None]
            if present:
                # One transfer for all units rather than one per unit.
                numbers = torch.stack([t for _, t in present]).tolist()
                values.update(
                    {f"diag/{kind}/{i}": v for (i, _), v in zip(present, numbers, strict=True)}
                )
        return values
