"""PBR's end-of-task uncertainty-guided walk (docs/method.md), with the stream counts its sample-in
probability reads."""

from __future__ import annotations

import torch

from pbr.memory.base import Memory, TaskEnd
from pbr.rng import check_generator
from pbr.selection import CANDIDATES, EVICTIONS, ORDERS, POOLS, RANKS, sample_in_probability, walk_order


class UncertaintyWalk(Memory):
    """At each task's end, the walk over the task's samples ordered by the learner's scores (PBR:
    the MC-dropout MI). `order`, `candidate`, `power`, `rank`, `outliers`: see `walk`; `count`: N of
    the sample-in probability counts this walk's steps ("task") or the whole stream ("stream");
    `offset`: its s_i are the running counts of the classes seen before the task ("class") or the
    sample counts of the earlier tasks ("task"); `pool`: the walk runs over the task's samples
    ("task") or over the buffer's and the task's, all scored by the learner at the task's end
    ("buffer_and_task", see end_task)."""

    def __init__(self, buffer, generator, learner=None, order: str = "uncertain_first", candidate: str = "advance",
                 count: str = "task", offset: str = "class", power: float = 1.0, rank: str = "task",
                 outliers: float = 0.0, evict: str = "random", pool: str = "task") -> None:
        super().__init__(buffer, generator, learner)
        self.order, self.candidate, self.count, self.offset = order, candidate, count, offset
        self.power, self.rank, self.outliers, self.evict, self.pool = power, rank, outliers, evict, pool
        # Running class frequencies s_i, observed from the stream itself (no prior).
        self.class_counts = torch.zeros(buffer.n_classes, dtype=torch.float64)
        self.task_counts: list[int] = []  # samples of each finished task

    def offset_counts(self) -> torch.Tensor:
        """The s_i of the sample-in offset, from the tasks before the one being walked."""
        if self.offset == "task":
            return torch.tensor(self.task_counts, dtype=torch.float64)
        return self.class_counts[self.class_counts > 0]

    def end_task(self, end: TaskEnd) -> None:
        """The walk over the task just learned (before the task's counts join the offset).

        pool "buffer_and_task": the buffer's samples, then the task's, are scored together by the
        learner (the same model, in one call), the stored samples' scores are replaced by their new
        ones, and the walk runs over the union. N counts the walk's steps over the union (plus the
        stream's earlier samples under count "stream"); the offset's s_i stay the stream's counts
        of the earlier tasks or classes, whatever the buffer holds of them."""
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}, got {self.pool!r}")
        start = int(self.class_counts.sum()) if self.count == "stream" else 0
        tasks = torch.full_like(end.labels, end.task)
        n = self.buffer.size
        if self.pool == "buffer_and_task" and n > 0:
            buf, dev = self.buffer, end.images.device
            images = torch.cat([buf.images[:n].to(dev), end.images])
            labels = torch.cat([buf.labels[:n].to(end.labels.device), end.labels])
            tasks = torch.cat([buf.tasks[:n].to(tasks.device), tasks])
            scores = end.learner.memory_scores(end.task, images, labels)
            buf.scores[:n] = scores[:n].to(buf.device, torch.float32)
            stored = torch.cat([torch.arange(n), torch.full((end.labels.shape[0],), -1)])
            self.walk(images, labels, tasks, scores, self.offset_counts(), start, stored=stored)
        else:
            self.walk(end.images, end.labels, tasks, end.scores, self.offset_counts(), start)
        self.class_counts += torch.bincount(end.labels.cpu(), minlength=self.buffer.n_classes).double()
        self.task_counts.append(int(end.labels.shape[0]))

    def walk(self, images: torch.Tensor, labels: torch.Tensor, tasks: torch.Tensor, scores: torch.Tensor,
             class_counts: torch.Tensor, start: int = 0, logits: torch.Tensor | None = None,
             outliers: float | None = None, stored: torch.Tensor | None = None) -> torch.Tensor:
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

        `evict`: which slot an accepted sample takes once the buffer is full: a uniformly random
        one ("random", the slots drawn above), the one holding the lowest stored score ("certain")
        or the highest ("uncertain"), ties to the lowest slot; a sample stored by this walk holds
        its own score from then on, so the choice is made one acceptance at a time. The slots are
        drawn under every rule, so the other draws stay the same.
        `stored` [B] (the pool "buffer_and_task"): each row's buffer slot, -1 for a task sample. An
        accepted row still in its slot is stored already: nothing is written, the acceptance is
        spent (with "hold", the k-th acceptance is the k-th sample of the order whatever it is); a
        stored row evicted earlier in this walk is written back like a new sample.
        """
        outliers = self.outliers if outliers is None else outliers
        if not 0.0 <= outliers < 1.0:
            raise ValueError(f"outliers must be in [0, 1), got {outliers}")
        if outliers > 0.0:
            n_out = int(outliers * scores.shape[0])
            kept = torch.argsort(scores, stable=True)[: scores.shape[0] - n_out].sort().values
            sub = self.walk(images[kept.to(images.device)], labels[kept.to(labels.device)], tasks[kept.to(tasks.device)],
                            scores[kept], class_counts, start,
                            None if logits is None else logits[kept.to(logits.device)], outliers=0.0,
                            stored=None if stored is None else stored[kept.cpu()])
            accepted = torch.zeros(scores.shape[0], dtype=torch.bool, device=scores.device)
            accepted[kept] = sub
            return accepted
        if self.rank not in RANKS:
            raise ValueError(f"rank must be one of {RANKS}, got {self.rank!r}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.candidate not in CANDIDATES:
            raise ValueError(f"candidate must be one of {CANDIDATES}, got {self.candidate!r}")
        if self.evict not in EVICTIONS:
            raise ValueError(f"evict must be one of {EVICTIONS}, got {self.evict!r}")
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
        if self.evict != "random" or stored is not None:
            return self._place_one_by_one(images, labels, tasks, scores, logits, perm, accept, rand_slot, stored)
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

    def _place_one_by_one(self, images, labels, tasks, scores, logits, perm, accept, rand_slot, stored):
        """The walk's writes when a slot depends on what the walk stored before (evict by score, a
        pool holding stored samples): one acceptance at a time on the host (once per task). With
        evict "random" and no stored rows it places exactly as the vectorised path in `walk`."""
        buf = self.buffer
        steps = torch.nonzero(accept).squeeze(1)
        src = perm[: steps.numel()] if self.candidate == "hold" else perm[steps]
        held = buf.scores.detach().double().cpu().clone()  # the stored scores as the walk leaves them
        new = scores.detach().double().cpu()
        slot_of = [-1] * scores.shape[0] if stored is None else stored.tolist()
        size, written, targets, rows, random_slot = buf.size, set(), [], [], rand_slot.tolist()
        for i, step in zip(src.tolist(), steps.tolist()):
            if slot_of[i] >= 0 and slot_of[i] not in written:
                continue  # still stored: nothing to write
            if size < buf.capacity:
                slot, size = size, size + 1
            elif self.evict == "random":
                slot = random_slot[step]
            else:
                slot = int(held.argmin() if self.evict == "certain" else held.argmax())
            held[slot] = new[i]
            written.add(slot)
            targets.append(slot)
            rows.append(i)
        idx = torch.tensor(rows, dtype=torch.int64, device=scores.device)
        buf.write(torch.tensor(targets, dtype=torch.int64), images[idx.to(images.device)], labels[idx.to(labels.device)],
                  tasks[idx.to(tasks.device)], None if logits is None else logits[idx.to(logits.device)], scores[idx])
        buf.size = size
        accepted = torch.zeros(scores.shape[0], dtype=torch.bool, device=scores.device)
        accepted[src] = True
        return accepted

    def state_dict(self):
        return {**super().state_dict(), "class_counts": self.class_counts.clone(), "task_counts": list(self.task_counts)}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.class_counts = state["class_counts"].cpu().clone()  # kept on the host
        self.task_counts = list(state["task_counts"])
