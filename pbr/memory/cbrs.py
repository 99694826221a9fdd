"""CBRS: class-balancing reservoir sampling (Chrysakis and Moens 2020).

Until the memory is full every sample is stored. Then a class is "full" once it has been the
largest class in the full memory (and stays so). A sample of a class that is not full replaces a
random stored sample of a largest class (ties broken at random); a sample of a full class c
replaces a random stored sample of its own class with probability m_c / n_c (m_c stored, n_c seen
so far, this one included), else it is dropped. So each full class keeps a uniform sample of its
stream, and the small classes take slots from the large ones.
"""

from __future__ import annotations

from typing import Any

from pbr.memory.label_counts import LabelCounts, pick


class ClassBalancingReservoir(LabelCounts):
    def __init__(self, buffer, generator, learner=None) -> None:
        super().__init__(buffer, generator, learner)
        self.full: set[int] = set()

    def place(self, label: int, u: list[float]) -> int:
        cap, slots, seen = self.buffer.capacity, self.slots, self.class_seen
        seen[label] += 1
        slot = self.take_free_slot(label)
        if slot is None:
            stored = self.stored()
            if label not in self.full:
                most = max(stored)
                victim = pick([c for c, m in enumerate(stored) if m == most], u[0])
            elif u[0] < stored[label] / seen[label]:
                victim = label
            else:
                return cap
            slot = pick([i for i, c in enumerate(slots) if c == victim], u[1])
            slots[slot] = label
        if len(slots) == cap:
            stored = self.stored()
            most = max(stored)
            self.full |= {c for c, m in enumerate(stored) if m == most}
        return slot

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "full": sorted(self.full)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.full = set(state["full"])
