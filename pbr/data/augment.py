"""Batched training augmentation on uint8 tensors (any device): random crop with zero padding,
horizontal flip, per-channel normalisation. One gather per batch, no PIL, no per-image loop."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from pbr.data.facts import DATASETS

MEAN_STD: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    k: (d.mean, d.std) for k, d in DATASETS.items()}


def _check_uint8(x: torch.Tensor) -> None:
    if x.dtype != torch.uint8 or x.dim() != 4:
        raise ValueError(f"expected a uint8 [B, C, H, W] batch, got {x.dtype} {tuple(x.shape)}")


def normalize(x_uint8: torch.Tensor, mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """(x / 255 - mean) / std per channel, float32."""
    _check_uint8(x_uint8)
    m = torch.as_tensor(mean, dtype=torch.float32, device=x_uint8.device).reshape(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float32, device=x_uint8.device).reshape(1, -1, 1, 1)
    if m.shape[1] != x_uint8.shape[1] or s.shape[1] != x_uint8.shape[1]:
        raise ValueError(f"mean/std need {x_uint8.shape[1]} channels, got {m.shape[1]} and {s.shape[1]}")
    return (x_uint8.to(torch.float32) / 255.0 - m) / s


def sample_crop_flip_params(
    n: int, padding: int, generator: torch.Generator, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dy, dx, flip): offsets uniform in [0, 2 * padding], flip with p = 0.5, drawn in that order."""
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    if generator.device.type != torch.device(device).type:
        raise ValueError(f"generator is on {generator.device.type}, images on {torch.device(device).type}: they must match")
    dy = torch.randint(2 * padding + 1, (n,), generator=generator, device=device)
    dx = torch.randint(2 * padding + 1, (n,), generator=generator, device=device)
    flip = torch.rand(n, generator=generator, device=device) < 0.5
    return dy, dx, flip


def crop_flip(x_uint8: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """Zero-pad by `padding`, crop HxW at (dy, dx) of the padded image, then flip where `flip`."""
    _check_uint8(x_uint8)
    b, _, h, w = x_uint8.shape
    xp = F.pad(x_uint8, (padding, padding, padding, padding)).permute(0, 2, 3, 1)  # [B, Hp, Wp, C]
    rows = dy.reshape(b, 1) + torch.arange(h, device=x_uint8.device)  # [B, H]
    cols = dx.reshape(b, 1) + torch.arange(w, device=x_uint8.device)  # [B, W]
    cols = torch.where(flip.reshape(b, 1), cols.flip(1), cols)
    batch = torch.arange(b, device=x_uint8.device).reshape(b, 1, 1)
    out = xp[batch, rows.unsqueeze(2), cols.unsqueeze(1)]  # [B, H, W, C]
    return out.permute(0, 3, 1, 2).contiguous()


def random_crop_flip(x_uint8: torch.Tensor, padding: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random crop (zero padding) and horizontal flip; uint8 in, uint8 out, same shape."""
    _check_uint8(x_uint8)
    if generator is None:
        raise ValueError("a torch.Generator is required")
    dy, dx, flip = sample_crop_flip_params(x_uint8.shape[0], padding, generator, x_uint8.device)
    return crop_flip(x_uint8, dy, dx, flip, padding)


class Augment:
    """Training transform: crop + flip, then normalise. `(x_uint8, generator) -> float32`."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], padding: int = 4) -> None:
        if len(mean) != len(std):
            raise ValueError(f"mean and std differ in length: {len(mean)} vs {len(std)}")
        if min(std) <= 0:
            raise ValueError(f"std must be > 0, got {tuple(std)}")
        if padding < 0:
            raise ValueError(f"padding must be >= 0, got {padding}")
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.padding = padding

    def __call__(self, x_uint8: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return normalize(random_crop_flip(x_uint8, self.padding, generator), self.mean, self.std)
