"""PRS: partitioning reservoir sampling (Kim, Jeong and Kim 2020), single-label, with ER's replay
step; the policy is pbr/memory/prs.py."""

from __future__ import annotations

from pbr.memory.prs import PartitioningReservoir
from pbr.methods.base import Setting, non_negative
from pbr.methods.label_counts import LabelCountReplay

RHO = Setting("rho", float, 0.0, "PRS's power of allocation: class shares proportional to n_c^rho "
              "(0: equal shares, 1: as the stream)", non_negative, "a number >= 0")


class PRS(LabelCountReplay):
    name = "prs"
    label = "PRS (label counts)"
    memory = PartitioningReservoir
    settings = (*LabelCountReplay.settings, RHO)

    def make_policy(self, buffer):
        return self.memory(buffer, self.ctx.generator, self, rho=self.opts.rho)
