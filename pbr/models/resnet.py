"""ResNet18 with the CIFAR stem, as in the Mammoth framework.

3x3 stem at stride 1 and no max-pool keep the spatial resolution of 32x32 inputs; the same
network runs unchanged on 64x64 TinyImageNet (the global pool absorbs the larger map).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _conv3x3(in_planes: int, planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """Backbone only: returns the globally pooled feature [B, 8 * width]."""

    def __init__(self, width: int = 64, in_channels: int = 3) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.width = width
        self.feature_dim = 8 * width
        self.conv1 = _conv3x3(in_channels, width)
        self.bn1 = nn.BatchNorm2d(width)
        layers: list[nn.Module] = []
        in_planes = width
        for mult, stride in ((1, 1), (2, 2), (4, 2), (8, 2)):
            planes = mult * width
            layers.append(nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes, 1)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output [B, 8 * width, H, W], before the pooling (MC dropout on the
        backbone drops its elements: pbr.uncertainty)."""
        out = F.relu(self.bn1(self.conv1(x)))
        return self.layer4(self.layer3(self.layer2(self.layer1(out))))

    @staticmethod
    def pool(fmap: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(fmap, 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.feature_map(x))
