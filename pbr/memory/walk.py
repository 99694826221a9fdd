"""PBR's end-of-task uncertainty-guided walk (docs/method.md), with the stream counts its sample-in
probability reads."""

from __future__ import annotations

import torch

from pbr.memory.base import Memory, TaskEnd
from pbr.rng import check_generator
from pbr.selection import CANDIDATES, ORDERS, RANKS, sample_in_probability, walk_order


class UncertaintyWalk(Memory):
    """At each task's end, the walk over the task's samples ordered by the learner's scores (PBR:
    the MC-dropout MI). `order`, `candidate`, `power`, `rank`, `outliers`: see `walk`; `count`: N of
    the sample-in probability counts this walk's steps ("task") or the whole stream ("stream");
    `offset`: its s_i are the running counts of the classes seen before the task ("class") or the
    sample counts of the earlier tasks ("task")."""

    def __init__(self, buffer, generator, learner=None, order: str = "uncertain_first", candidate: str = "advance",
                 count: str = "task", offset: str = "class", power: float = 1.0, rank: str = "task",
                 outliers: float = 0.0) -> None:
        super().__init__(buffer, generator, learner)
        self.order, self.candidate, self.count, self.offset = order, candidate, count, offset
        self.power, self.rank, self.outliers = power, rank, outliers
        # Running class frequencies s_i, observed from the stream itself (no prior).
        self.class_counts = torch.zeros(buffer.n_classes, dtype=torch.float64)
        self.task_counts: list[int] = []  # samples of each finished task

    def offset_counts(self) -> torch.Tensor:
        """The s_i of the sample-in offset, from the tasks before the one being walked."""
        if self.offset == "task":
            return torch.tensor(self.task_counts, dtype=torch.float64)
        return self.class_counts[self.class_counts > 0]

    def end_task(self, end: TaskEnd) -> None:
        """The walk over the task just learned (before the task's counts join the offset)."""
        scores = end.scores
        start = int(self.class_counts.sum()) if self.count == "stream" else 0
        self.walk(end.images, end.labels, torch.full_like(end.labels, end.task), scores, self.offset_counts(), start)
        self.class_counts += torch.bincount(end.labels.cpu(), minlength=self.buffer.n_classes).double()
        self.task_counts.append(int(end.labels.shape[0]))

    def walk(self, images: torch.Tensor, labels: torch.Tensor, tasks: torch.Tensor, scores: torch.Tensor,
             class_counts: torch.Tensor, start: int = 0, logits: torch.Tensor | None = None,
             outliers: float | None = None) -> torch.Tensor:
        """The walk over one task's samples. Returns the accept mask [B] (input order; an accepted
        sample may be overwritten later in the same walk).

        The samples are walked in `order` of `scores` ("uncertain_first": the paper's text;
        "certain_first": its Eq.'s arg min; "random": the Ours-Random ablation; "uncertain_weighted":
        a random order drawn with weights = scores, weighted reservoir sampling's priority). Step N
        (1-based) is accepted iff u_N < min(1, P_N), P from `sample_in_probability` with
        `class_counts` (the classes seen before this task) and `start`. Accepted samples fill free
        slots in walk order, then each replaces a uniformly random slot.

        `candidate`: "advance" (every step moves on to the next sample) or "hold" (the paper's text:
        a rejected candidate stays the candidate for the next step, so the k-th acceptance stores
        the k-th sample in walk order). With "advance" and a full buffer the walk keeps each sample
        with probability capacity / (n + offset) whatever its position: the product of acceptance
        and survival telescopes, so the MI order has no effect.

        Draws from the generator (on `scores`' device), in this order: the permutation (random and
        weighted orders only), u = torch.rand(B, float64), slots = torch.randint(capacity, (B,)).
        `power` and `rank` shape the order (walk_order); `outliers` leaves the given fraction of
        the task's highest scores out of the walk (the most uncertain samples of a task are often
        mislabelled or atypical ones), the walk running over the rest.
        """
        outliers = self.outliers if outliers is None else outliers
        if not 0.0 <= outliers < 1.0:
            raise ValueError(f"outliers must be in [0, 1), got {outliers}")
        if outliers > 0.0:
            n_out = int(outliers * scores.shape[0])
            kept = torch.argsort(scores, stable=True)[: scores.shape[0] - n_out].sort().values
            sub = self.walk(images[kept.to(images.device)], labels[kept.to(labels.device)], tasks[kept.to(tasks.device)],
                            scores[kept], class_counts, start,
                            None if logits is None else logits[kept.to(logits.device)], outliers=0.0)
            accepted = torch.zeros(scores.shape[0], dtype=torch.bool, device=scores.device)
            accepted[kept] = sub
            return accepted
        if self.rank not in RANKS:
            raise ValueError(f"rank must be one of {RANKS}, got {self.rank!r}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.candidate not in CANDIDATES:
            raise ValueError(f"candidate must be one of {CANDIDATES}, got {self.candidate!r}")
        buf = self.buffer
        b = buf.check_batch(images, labels, tasks, logits)
        if scores.shape != (b,):
            raise ValueError(f"scores must be [{b}], got {tuple(scores.shape)}")
        dev = scores.device
        g = check_generator(self.generator, dev)
        perm = walk_order(scores, self.order, g, self.power, labels, self.rank)
        p = sample_in_probability(b, torch.as_tensor(class_counts).to(dev), buf.capacity, start)
        u = torch.rand(b, dtype=torch.float64, generator=g, device=dev)
        rand_slot = torch.randint(buf.capacity, (b,), generator=g, device=dev)
        accept = u < p.clamp(max=1.0)  # walk order
        rank = torch.cumsum(accept, 0) - 1
        free = buf.capacity - buf.size
        slot = torch.where(rank < free, buf.size + rank, rand_slot)
        slot = torch.where(accept, slot, buf.capacity)
        # Once per task, so a host sync is fine: move only the accepted rows to the buffer.
        rows = torch.nonzero(accept).squeeze(1)
        src = perm[: rows.numel()] if self.candidate == "hold" else perm[rows]
        buf.write(slot[rows], images[src.to(images.device)], labels[src.to(labels.device)],
                  tasks[src.to(tasks.device)], None if logits is None else logits[src.to(logits.device)], scores[src])
        buf.size = min(buf.capacity, buf.size + rows.numel())
        accepted = torch.zeros(b, dtype=torch.bool, device=dev)
        accepted[src] = True
        return accepted

    def state_dict(self):
        return {**super().state_dict(), "class_counts": self.class_counts.clone(), "task_counts": list(self.task_counts)}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.class_counts = state["class_counts"].cpu().clone()  # kept on the host
        self.task_counts = list(state["task_counts"])
