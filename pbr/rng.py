"""Seeded draws: every random choice of the library comes from a generator the caller passes."""

from __future__ import annotations

import torch


def check_generator(generator: torch.Generator | None, device: torch.device) -> torch.Generator:
    if generator is None:
        raise ValueError("a torch.Generator is required")
    if generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device.type}, the draws are on {device.type}: they must match")
    return generator
