"""The original ImageNet nets are torchvision's, key for key and output for output."""

from __future__ import annotations

import pytest
import torch
import torchvision

import models


@pytest.mark.parametrize("depth", [18, 34, 50, 101, 152])
def test_state_dict_keys_and_shapes_equal_torchvision(depth: int) -> None:
    with torch.device("meta"):
        ours = models.build(f"resnet{depth}", num_classes=1000).state_dict()
        theirs = getattr(torchvision.models, f"resnet{depth}")().state_dict()
    assert list(ours) == list(theirs)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


@pytest.mark.parametrize("depth", [50, 101, 152])
def test_stride_on_1x1_keeps_torchvisions_keys_and_shapes(depth: int) -> None:
    # The authors' released weights ("v1") then map onto ours by name.
    with torch.device("meta"):
        ours = models.build(f"resnet{depth}", num_classes=1000, stride_on="1x1").state_dict()
        theirs = getattr(torchvision.models, f"resnet{depth}")().state_dict()
    assert list(ours) == list(theirs)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}


@pytest.mark.parametrize(("depth", "num_classes"), [(50, 1000), (18, 10)])
def test_torchvision_weights_load_strictly_and_give_the_same_outputs(
    depth: int, num_classes: int
) -> None:
    torch.manual_seed(0)
    reference = _randomised(getattr(torchvision.models, f"resnet{depth}")(num_classes=num_classes))
    ours = models.build(f"resnet{depth}", num_classes=num_classes)
    ours.load_state_dict(reference.state_dict(), strict=True)
    ours.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), rtol=1e-5, atol=1e-5)


def test_stride_on_1x1_is_torchvisions_net_with_the_stride_moved_to_the_first_1x1() -> None:
    torch.manual_seed(0)
    reference = _randomised(torchvision.models.resnet50(num_classes=10))
    for unit in reference.modules():
        if isinstance(unit, torchvision.models.resnet.Bottleneck) and unit.conv2.stride == (2, 2):
            unit.conv1.stride, unit.conv2.stride = (2, 2), (1, 1)  # the 2015 paper's "v1"
    ours = models.build("resnet50", num_classes=10, stride_on="1x1")
    ours.load_state_dict(reference.state_dict(), strict=True)
    ours.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), rtol=1e-5, atol=1e-5)
        default = models.build("resnet50", num_classes=10)
        default.load_state_dict(reference.state_dict(), strict=True)
        assert not torch.allclose(default.eval()(x), reference(x), atol=1e-3)


def _randomised(net: torch.nn.Module) -> torch.nn.Module:
    """`net` in eval mode with random BN statistics, so that eval-mode BN is not an identity."""
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            assert m.running_mean is not None
            assert m.running_var is not None
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return net.eval()
