"""PRS: partitioning reservoir sampling (Kim, Jeong and Kim 2020), single-label.

Each class in the memory has a target share p_c = n_c^rho / sum_j n_j^rho of its slots (n_c: the
stream samples of class c seen so far; the sum over the classes in the memory; rho = 0 gives equal
shares, as the authors' single-label configs use). Once the memory is full, a sample of class c
comes in with probability min(1, capacity * p_c / n_c); it then evicts a sample of a class drawn
with probability softmax(l_j - p_j * capacity), l_j the slots class j holds, so the class furthest
above its share most likely gives one up (a random one of its samples; with single labels every
choice leaves the same partition). Counts are updated after each sample's decision, as the
authors' code does. A class that has left the memory keeps the share it had when it was last
there (the authors' code recomputes shares over the classes in memory only and leaves the others'
as they were), so it can come back; a class never stored has share 0 and its first sample comes
in (n_c = 0).
"""

from __future__ import annotations

import math

from typing import Any

from pbr.memory.label_counts import LabelCounts, pick


class PartitioningReservoir(LabelCounts):
    def __init__(self, buffer, generator, learner=None, rho: float = 0.0) -> None:
        super().__init__(buffer, generator, learner)
        self.rho = rho
        self.last_share: dict[int, float] = {}  # each class's share when it was last in the memory

    def place(self, label: int, u: list[float]) -> int:
        cap, slots, seen = self.buffer.capacity, self.slots, self.class_seen
        slot = self.take_free_slot(label)
        if slot is None:
            slot = cap
            stored = self.stored()
            in_memory = [c for c, m in enumerate(stored) if m > 0]
            total = sum(seen[c] ** self.rho for c in in_memory)
            share = {c: seen[c] ** self.rho / total for c in in_memory}
            self.last_share.update(share)
            target = cap * self.last_share.get(label, 0.0)
            accept = target / seen[label] if seen[label] > target else 1.0
            if u[0] < accept:
                deltas = [stored[c] - share[c] * cap for c in in_memory]
                top = max(deltas)
                weights = [math.exp(d - top) for d in deltas]
                r, acc, victim = u[1] * sum(weights), 0.0, in_memory[-1]
                for c, w in zip(in_memory, weights):
                    acc += w
                    if r < acc:
                        victim = c
                        break
                slot = pick([i for i, c in enumerate(slots) if c == victim], u[2])
                slots[slot] = label
        seen[label] += 1
        return slot

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "last_share": dict(self.last_share)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.last_share = {int(c): float(v) for c, v in state.get("last_share", {}).items()}
