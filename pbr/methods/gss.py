"""GSS: gradient-based sample selection (Aljundi et al. 2019), the greedy variant, with ER's step.

Each step is ER's (CE on the current batch and a memory batch); the memory keeps the samples whose
gradients are diverse, by the GSS paper's greedy rule or Mammoth's (pbr/memory/gss.py).
"""

from __future__ import annotations

from typing import Literal

from pbr.memory.gss import GradientDiversity
from pbr.methods.base import MAMMOTH, RESERVOIR, Best, Setting, positive
from pbr.methods.er import ER

SUBSET = Setting("gss_subset", int, 32, "GSS: stored samples whose gradients a new sample is compared with",
                 positive, "a positive integer")
RULE = Setting("gss_rule", Literal["paper", "mammoth"], "paper",
               "GSS: who is stored, the GSS paper's greedy rule on each sample's own score or Mammoth's, gated by "
               "the batch-mean gradient's score")


class GSS(ER):
    name = "gss"
    label = "GSS"
    memory = GradientDiversity
    settings = (RESERVOIR, SUBSET, RULE)
    best = (Best("cifar10", None, {"lr": 0.03}, f"{MAMMOTH} seq-cifar10 (buffer 200, 500, 5120)"),)

    def make_policy(self, buffer):
        return self.memory(buffer, self.ctx.generator, self, subset=self.opts.gss_subset, rule=self.opts.gss_rule)
