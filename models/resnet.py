"""One ResNet skeleton for every net of both papers: a stem, stages of units, a classifier.

The CIFAR stem is one 3x3 conv with 16 filters on 32x32 maps (2015 Sec. 4.2); the ImageNet
stem is a 7x7/2 conv and a 3x3/2 max-pool (2015 Table 1). Pre-activation nets put the
first activation right after the stem conv and an extra activation after the last
addition (2016 Sec. 4.1), so that the path from unit to unit is a clean identity.
"""

from __future__ import annotations

from torch import Tensor, nn

from models.blocks import BasicBlock, Bottleneck, ResidualUnit
from models.config import Architecture
from models.layers import Gate, conv3x3


def _stem(arch: Architecture, in_channels: int) -> tuple[nn.Conv2d, nn.Module]:
    """The first conv, and the pooling that follows its activation (ImageNet only)."""
    width = arch.widths[0]
    if arch.stem == "cifar":
        return conv3x3(in_channels, width), nn.Identity()
    conv = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
    return conv, nn.MaxPool2d(3, stride=2, padding=1)


def _final_activation(arch: Architecture, channels: int) -> nn.Module:
    """The activation after the last addition, which pre-activation units leave out."""
    if arch.unit.unit == "full_preact":
        return nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU())
    if arch.unit.unit == "relu_only_preact":
        return nn.ReLU()
    return nn.Identity()


class ResNet(nn.Module):
    """A residual (or plain) network built from an `Architecture`.

    The uniform API of timm: `forward_features` (to the last feature map),
    `forward_head` (pool and classify), `reset_classifier`.
    """

    def __init__(self, arch: Architecture, *, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        self.arch = arch
        block: type[ResidualUnit] = Bottleneck if arch.block == "bottleneck" else BasicBlock
        self.conv1, self.maxpool = _stem(arch, in_channels)
        self.bn1 = nn.BatchNorm2d(arch.widths[0])
        self.relu = nn.ReLU()
        channels = arch.widths[0]
        for index, (count, width) in enumerate(zip(arch.layers, arch.widths, strict=True)):
            stride = 1 if index == 0 else 2
            units: list[nn.Module] = []
            for i in range(count):
                # The stem's activation serves as the very first unit's pre-activation.
                first_of_net = index == 0 and i == 0
                units.append(
                    block(
                        channels,
                        width,
                        stride if i == 0 else 1,
                        arch.unit,
                        preactivate=not first_of_net,
                    )
                )
                channels = width * block.expansion
            setattr(self, f"layer{index + 1}", nn.Sequential(*units))
        self.num_stages = len(arch.layers)
        self.final_act = _final_activation(arch, channels)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.num_features = channels
        self.fc = nn.Linear(channels, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        """He init (kaiming normal, fan-out, as torchvision and the authors' Torch code)."""
        if self.fc.weight.is_meta:
            # Built to count parameters and MACs: no values to set. (On the meta device
            # normal_ runs as Python decompositions: 3.6 s of ResNet-1202's 4.5 s build.)
            return
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.modules():
            if isinstance(m, Gate):
                m.reset_bias()
            if self.arch.zero_init_residual and isinstance(m, ResidualUnit):
                # Each unit then starts as its shortcut (Goyal et al. 2017; off by default).
                nn.init.zeros_(m.last_branch_layer().weight)

    def units(self) -> list[ResidualUnit]:
        """Every residual unit, in forward order (for diagnostics)."""
        return [m for m in self.modules() if isinstance(m, ResidualUnit)]

    def forward_features(self, x: Tensor) -> Tensor:
        """Stem, stages and final activation: the last feature map."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for index in range(1, self.num_stages + 1):
            x = getattr(self, f"layer{index}")(x)
        features: Tensor = self.final_act(x)
        return features

    def forward_head(self, x: Tensor) -> Tensor:
        """Global average pooling and the classifier."""
        logits: Tensor = self.fc(self.avgpool(x).flatten(1))
        return logits

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def reset_classifier(self, num_classes: int) -> None:
        """Replace the classifier with a fresh one for `num_classes` classes."""
        self.fc = nn.Linear(self.num_features, num_classes)
