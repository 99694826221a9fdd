"""Classifier heads. Each head splits into `embed` (what dropout acts on) and `project`
(dropped embedding -> logits), so MC-dropout scoring can sample the mask itself and run the
backbone only once (see pbr.uncertainty)."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn


def reset_linear_(weight: torch.Tensor, bias: torch.Tensor | None, generator: torch.Generator | None = None) -> None:
    """PyTorch's default nn.Linear / nn.Conv2d initialisation, optionally from `generator`."""
    with torch.no_grad():
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
        if bias is not None:
            fan_in = weight[0].numel()
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            nn.init.uniform_(bias, -bound, bound, generator=generator)


def without_autocast(device_type: str):
    """autocast turned off for a block where it is on; nothing to undo elsewhere (a meta tensor has none)."""
    if device_type != "meta" and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


class Head(nn.Module):
    """Base class: logits = project(dropout(embed(f)))."""

    def __init__(self, in_dim: int, n_classes: int, dropout: float) -> None:
        super().__init__()
        if in_dim < 1 or n_classes < 1:
            raise ValueError(f"in_dim and n_classes must be >= 1, got {in_dim} and {n_classes}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.p = float(dropout)
        self.weight = nn.Parameter(torch.empty(n_classes, in_dim))

    @property
    def n_classes(self) -> int:
        return self.weight.shape[0]

    def embed(self, f: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def project(self, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, f: torch.Tensor, mc: bool = False) -> torch.Tensor:
        # mc=True keeps dropout on in eval mode (global RNG); pbr.uncertainty.mc_probs is
        # the reproducible, batched alternative.
        # In fp32 under bf16 autocast too (the backbone stays bf16): the losses scale the logits (s /
        # tau1 = 100 in the paper's reading), and bf16's 8-bit mantissa would put errors of up to 0.7
        # on them, 6% on a softmax probability (docs/method.md, "bf16"). The layer is tiny.
        with without_autocast(f.device.type):
            z = F.dropout(self.embed(f.to(self.weight.dtype)), self.p, training=self.training or mc)
            return self.project(z)

    def weight_norms(self) -> torch.Tensor:
        return self.weight.norm(dim=1)


class CosineHead(Head):
    """logits = scale * dropout(f / |f|) @ (W / |W|).T, no bias."""

    def __init__(self, in_dim: int, n_classes: int, scale: float = 10.0, dropout: float = 0.1) -> None:
        super().__init__(in_dim, n_classes, dropout)
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.scale = float(scale)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        reset_linear_(self.weight, None, generator)

    def embed(self, f: torch.Tensor) -> torch.Tensor:
        return F.normalize(f, dim=-1)

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return self.scale * (z @ self.prototypes().T)

    def prototypes(self) -> torch.Tensor:
        return F.normalize(self.weight, dim=-1)


class LinearHead(Head):
    """Ablation head: logits = dropout(f) @ W.T + b."""

    def __init__(self, in_dim: int, n_classes: int, dropout: float = 0.1) -> None:
        super().__init__(in_dim, n_classes, dropout)
        self.bias = nn.Parameter(torch.empty(n_classes))
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        reset_linear_(self.weight, self.bias, generator)

    def embed(self, f: torch.Tensor) -> torch.Tensor:
        return f

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(z, self.weight, self.bias)

    def prototypes(self) -> torch.Tensor:
        return self.weight
