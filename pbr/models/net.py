"""Backbone + head, the network every method trains."""

from __future__ import annotations

import torch
from torch import nn

from pbr.models.heads import CosineHead, Head, LinearHead, reset_linear_
from pbr.models.resnet import ResNet18

HEADS = ("cosine", "linear")


def init_parameters(module: nn.Module, generator: torch.Generator) -> None:
    """Re-initialise `module` with PyTorch's default schemes, drawing from `generator`,
    so that a seeded run does not depend on the global RNG."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            reset_linear_(m.weight, m.bias, generator)
        elif isinstance(m, Head):
            m.reset_parameters(generator)
        elif isinstance(m, nn.BatchNorm2d):
            m.reset_parameters()


class Net(nn.Module):
    def __init__(
        self,
        n_classes: int,
        width: int = 64,
        head: str = "cosine",
        scale: float = 10.0,
        dropout: float = 0.1,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        self.backbone = ResNet18(width)
        self.feature_dim = self.backbone.feature_dim
        self.head: Head
        if head == "cosine":
            self.head = CosineHead(self.feature_dim, n_classes, scale=scale, dropout=dropout)
        else:
            self.head = LinearHead(self.feature_dim, n_classes, dropout=dropout)
        if generator is not None:
            init_parameters(self, generator)

    @property
    def n_classes(self) -> int:
        return self.head.n_classes

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def classify(self, f: torch.Tensor, mc: bool = False) -> torch.Tensor:
        return self.head(f, mc=mc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(x))

    def prototypes(self) -> torch.Tensor:
        """Normalised class vectors [C, D] (cosine head) or raw W (linear head)."""
        return self.head.prototypes()

    def weight_norms(self) -> torch.Tensor:
        return self.head.weight_norms()
