"""Unit wiring: the 2016 paper's clean path, gates, scaling, and the diagnostics tap."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import nn

import models
from models.blocks import BasicBlock, Bottleneck, ResidualUnit
from models.config import UNITS, Unit, UnitConfig
from models.layers import Gate

CHANNELS = 8


def _stack(unit: Unit, block: type[ResidualUnit] = BasicBlock, depth: int = 4) -> nn.Sequential:
    """Units of constant width whose residual branches output exactly zero."""
    planes = CHANNELS // block.expansion
    units = [block(CHANNELS, planes, 1, UnitConfig(unit=unit)) for _ in range(depth)]
    for u in units:
        _silence(u)
    return nn.Sequential(*units)


def _silence(unit: ResidualUnit) -> None:
    """Make the unit's residual branch output zero by zeroing its last conv or BN."""
    last = unit.last_branch_layer()
    nn.init.zeros_(last.weight)
    if isinstance(last, nn.BatchNorm2d):
        nn.init.zeros_(last.bias)


images = arrays(
    np.float32,
    st.tuples(st.integers(1, 3), st.just(CHANNELS), st.integers(2, 6), st.integers(2, 6)),
    elements=st.floats(-1e3, 1e3, width=32),
)


@settings(max_examples=40, deadline=None)
@given(x=images, train=st.booleans())
@pytest.mark.parametrize("block", [BasicBlock, Bottleneck])
def test_full_preact_stack_is_exactly_the_identity(
    block: type[ResidualUnit], x: np.ndarray, train: bool
) -> None:
    stack = _stack("full_preact", block).train(train)
    inputs = torch.from_numpy(x)
    with torch.no_grad():
        assert torch.equal(stack(inputs), inputs)


@settings(max_examples=40, deadline=None)
@given(x=images)
def test_original_stack_clips_negatives(x: np.ndarray) -> None:
    stack = _stack("original").eval()
    inputs = torch.from_numpy(x)
    with torch.no_grad():
        out = stack(inputs)
    # The ReLU after each addition: the path is relu(x), not x, once anything is negative.
    assert torch.equal(out, inputs.relu())
    assert torch.equal(out, inputs) == bool((inputs >= 0).all())


@pytest.mark.parametrize("unit", UNITS)
def test_zero_init_residual_starts_every_unit_as_its_shortcut(unit: Unit) -> None:
    model = models.build("resnet20", unit=unit, zero_init_residual=True)
    for u in model.units():
        conv1 = u.conv1
        assert isinstance(conv1, nn.Conv2d)
        x = torch.randn(2, conv1.in_channels, 8, 8)
        residual = u.branch_out(u._run(u.branch_ops, u._run(u.pre_ops, x)))
        assert torch.count_nonzero(residual) == 0


def test_zero_init_residual_is_off_by_default() -> None:
    model = models.build("resnet20")
    assert all(u.last_branch_layer().weight.abs().sum() > 0 for u in model.units())


def _gate_biases(model: nn.Module) -> list[torch.Tensor]:
    return [g.conv.bias for g in model.modules() if isinstance(g, Gate) and g.conv.bias is not None]


def test_gates_start_at_the_configured_bias() -> None:
    biases = _gate_biases(
        models.build("resnet20", shortcut_variant="exclusive_gating", gate_bias=-7)
    )
    assert [b.numel() for b in biases] == [16] * 3 + [32] * 3 + [64] * 3
    assert all(bool((b == -7.0).all()) for b in biases)
    default = _gate_biases(models.build("resnet20", shortcut_variant="shortcut_only_gating"))
    assert len(default) == 9
    assert all(bool((b == -6.0).all()) for b in default)


def test_exclusive_gate_nearly_closed_passes_the_shortcut() -> None:
    gate = Gate(4, 4, 1, bias=-30.0, exclusive=True)
    gate.reset_bias()
    nn.init.zeros_(gate.conv.weight)
    x, residual = torch.randn(1, 4, 3, 3), torch.randn(1, 4, 3, 3)
    torch.testing.assert_close(gate(x, x, residual), x)
    shortcut_only = Gate(4, 4, 1, bias=30.0, exclusive=False)
    shortcut_only.reset_bias()
    nn.init.zeros_(shortcut_only.conv.weight)
    torch.testing.assert_close(shortcut_only(x, x, residual), residual)


def test_constant_scaling_halves_both_paths() -> None:
    unit = BasicBlock(
        4, 4, 1, UnitConfig(unit="relu_only_preact", shortcut_variant="constant_scaling")
    )
    _silence(unit)
    x = torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(unit(x), 0.5 * x)


def test_dropout_shortcut_drops_only_in_training() -> None:
    unit = BasicBlock(4, 4, 1, UnitConfig(unit="relu_only_preact", shortcut_variant="dropout"))
    _silence(unit)
    x = torch.rand(1, 4, 16, 16) + 1
    torch.testing.assert_close(unit.eval()(x), x)
    dropped = unit.train()(x)
    assert 0.3 < (dropped == 0).float().mean() < 0.7


def test_option_a_shortcut_pads_with_zero_channels() -> None:
    unit = BasicBlock(16, 32, 2, UnitConfig(unit="relu_only_preact"))
    assert unit.downsample is not None
    assert not list(unit.downsample.parameters())
    x = torch.randn(1, 16, 8, 8)
    h = unit.downsample(x)
    assert h.shape == (1, 32, 4, 4)
    assert torch.equal(h[:, :16], x[:, :, ::2, ::2])
    assert torch.count_nonzero(h[:, 16:]) == 0


def test_branch_out_sees_each_units_residual_response() -> None:
    model = models.build("resnet20").eval()
    responses: list[torch.Tensor] = []
    for u in model.units():
        u.branch_out.register_forward_hook(lambda _m, _i, out: responses.append(out))
    model(torch.randn(2, 3, 32, 32))
    assert [r.shape[1] for r in responses] == [16] * 3 + [32] * 3 + [64] * 3


def test_plain_units_have_no_shortcut() -> None:
    model = models.build("plain20")
    assert all(u.downsample is None and u.join is None for u in model.units())
