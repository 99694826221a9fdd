"""PRS: partitioning reservoir sampling (Kim, Jeong and Kim 2020), single-label, with ER's replay
step; the policy is pbr/memory/prs.py."""

from __future__ import annotations

from pbr.memory.prs import PartitioningReservoir
from pbr.methods.base import Setting
from pbr.methods.label_counts import LabelCountReplay

RHO = Setting("rho", float, 0.0, "PRS's power of allocation: class shares proportional to n_c^rho "
              "(0: equal shares, 1: as the stream)", lambda v: 0 <= v <= 50, "a number in [0, 50] (n_c^rho "
              "overflows a float beyond)")


class PRS(LabelCountReplay):
    name = "prs"
    label = "PRS (label counts)"
    memory = PartitioningReservoir
    settings = (*LabelCountReplay.settings, RHO)

    def make_policy(self, buffer):
        return self.memory(buffer, self.ctx.generator, self, rho=self.opts.rho)
