"""ER's step over a memory whose policy reads the stream's label counts (PRS, CBRS:
pbr/memory/label_counts.py); the report marks them "label counts"."""

from __future__ import annotations

from pbr.methods.base import Best
from pbr.methods.er import ER


class LabelCountReplay(ER):
    # The same replay step as ER, so its tuned lr: the memories differ, nothing else.
    best = tuple(Best(b.dataset, b.buffer_size, b.values, f"ER's ({b.source})") for b in ER.best)
