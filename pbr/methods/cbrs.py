"""CBRS: class-balancing reservoir sampling (Chrysakis and Moens 2020), with ER's replay step; the
policy is pbr/memory/cbrs.py."""

from __future__ import annotations

from pbr.memory.cbrs import ClassBalancingReservoir
from pbr.methods.label_counts import LabelCountReplay


class CBRS(LabelCountReplay):
    name = "cbrs"
    label = "CBRS (label counts)"
    memory = ClassBalancingReservoir
