"""Replay memory policies: what a method's buffer keeps (base.py: the interface; one file a policy).

A method names its policy with the class attribute `memory` (pbr/methods/base.py)."""

from pbr.memory.base import Memory, TaskEnd

__all__ = ["Memory", "TaskEnd"]
