"""The fidelity grid's readings of a proposed method's open points (`pbr sweep fidelity`, for the
method of role "ours"), by the method's name.

Kept out of the method's own file: pbr/methods is code that shapes the trained weights (the train
stage's DVC deps and resume fingerprint), and a reading added to the grid must keep every finished
run. A new proposed method with open points adds its entry here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Readings:
    """`pair`: two of the method's keys tried together, each pair of values a row
    NAME-<a's first word>-<b> (but the pairs the method itself or one of its ablations is);
    `one_at_a_time`: a key (its own, or a dotted key of another section) -> (short name, the values
    tried), a row NAME-<short><value> for each value other than params.yaml's; `literal`: its keys
    as the paper writes it (row NAME-literal)."""
    pair: tuple[tuple[str, tuple[Any, ...]], tuple[str, tuple[Any, ...]]] | None = None
    one_at_a_time: dict[str, tuple[str, tuple[Any, ...]]] = field(default_factory=dict)
    literal: dict[str, Any] = field(default_factory=dict)


READINGS: dict[str, Readings] = {
    # PBR (docs/method.md): the walk's order x offset counts, then one change at a time, then the
    # paper as written.
    "pbr": Readings(
        pair=(("buffer_order", ("uncertain_first", "certain_first", "random")), ("offset", ("class", "task"))),
        one_at_a_time={
            "kl_classes": ("kl", ("old", "all")),
            "mi_logits": ("mi", ("scaled", "cosine")),
            "tau1": ("tau1-", (0.1, 1.0)),
            "alpha": ("a", (0.3, 1.0, 3.0)),
            "beta": ("b", (0.0, 0.1, 1.0)),
            "train.lr": ("lr", (0.03, 0.1)),
            "imprint": ("imprint-", (False, True)),
            "walk_candidate": ("", ("hold", "advance")),
            # Readings of "uncertainty-guided" first tried after the pre-registration (selection seeds only).
            "walk_count": ("N-", ("task", "stream")),
            "buffer_order": ("", ("uncertain_weighted", "certain_weighted")),
            "mi_power": ("mipow", (1.0, 2.0, 0.5)),
            "walk_rank": ("rank-", ("task", "class")),
            "mi_outliers": ("out", (0.0, 0.05)),
            "mi_model": ("mi-", ("final", "teacher")),
            "evict": ("evict-", ("random", "certain", "uncertain")),
            "walk_pool": ("pool-", ("task", "buffer_and_task")),
            "mc_dropout": ("mcdrop", ("auto", 0.3)),
            "mc_samples": ("T", (20, 50)),
            "mi_epochs": ("miep", (1, 5)),
            "mc_backbone": ("mcbackbone-", (False, True)),
        },
        literal={"preset": "paper"},
    ),
}
