"""Fixed-capacity replay buffer: online reservoir (ER/DER baselines) and PBR's end-of-task
uncertainty-guided walk (docs/method.md).

Storage is preallocated with one spare "discard" row after the last slot: writes that must not
land (rejected samples, samples overwritten later in the same batch) are routed there, so a
batch is written with one index_copy_ and no host sync.
"""

from __future__ import annotations

from typing import Any

import torch

ORDERS = ("desc", "asc", "random", "weighted")
CANDIDATES = ("hold", "advance")


def _check_generator(generator: torch.Generator | None, device: torch.device) -> torch.Generator:
    if generator is None:
        raise ValueError("a torch.Generator is required")
    if generator.device.type != device.type:
        raise ValueError(f"generator is on {generator.device.type}, the draws are on {device.type}: they must match")
    return generator


def sample_in_probability(n_steps: int, class_counts: torch.Tensor, capacity: int, start: int = 0) -> torch.Tensor:
    """P_N = capacity / (N + sum_i s_i w_i), w = softmax(-s), for N = start+1..start+n_steps (float64).

    `start` = 0 counts the steps of this walk only (the paper's N_c read per walk); the number of
    samples walked in earlier tasks makes N count the whole stream (Mammoth's num_seen_examples).

    Raw P: the walk accepts with min(1, P). Empty `class_counts` (first task) gives sum 0.
    """
    if n_steps < 0:
        raise ValueError(f"n_steps must be >= 0, got {n_steps}")
    s = torch.as_tensor(class_counts).to(torch.float64).reshape(-1)
    # torch.softmax subtracts the max, so large counts do not underflow to 0/0.
    offset = (s * torch.softmax(-s, dim=0)).sum() if s.numel() else s.new_zeros(())
    n = torch.arange(start + 1, start + n_steps + 1, dtype=torch.float64, device=s.device)
    return capacity / (n + offset)


def walk_order(scores: torch.Tensor, order: str, generator: torch.Generator) -> torch.Tensor:
    """The indices of `scores` in walk order (see Buffer.uncertainty_walk)."""
    b, dev, g = scores.shape[0], scores.device, generator
    if order == "random":
        return torch.randperm(b, generator=g, device=dev)
    if order == "weighted":
        # Weighted random order (Efraimidis & Spirakis' A-Res keys u^(1/w), compared as
        # log(u) / w): sample i comes before j with odds w_i : w_j, w = the score, so the
        # uncertain samples come first in priority without the walk becoming a top-k.
        w = scores.double().clamp_min(0) + 1e-12
        keys = torch.log(torch.rand(b, dtype=torch.float64, generator=g, device=dev)) / w
        return torch.argsort(keys, descending=True, stable=True)
    return torch.argsort(scores, descending=order == "desc", stable=True)


class Buffer:
    """Replay memory. `images` uint8 [cap, C, H, W], `labels`/`tasks` int64 [cap],
    `logits` float32 [cap, n_classes], `scores` float32 [cap]; slots [0, size) are filled.
    `size` and `seen` (stream samples offered to reservoir_add) are host ints."""

    def __init__(
        self,
        capacity: int,
        image_shape: tuple[int, ...] = (3, 32, 32),
        n_classes: int | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if n_classes is None or n_classes < 1:
            raise ValueError(f"n_classes must be given and >= 1, got {n_classes}")
        self.capacity = int(capacity)
        self.image_shape = tuple(int(d) for d in image_shape)
        self.n_classes = int(n_classes)
        self.device = torch.device(device)
        rows = self.capacity + 1  # + the discard row
        self._images = torch.zeros((rows, *self.image_shape), dtype=torch.uint8, device=self.device)
        self._labels = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self._tasks = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self._logits = torch.zeros((rows, self.n_classes), dtype=torch.float32, device=self.device)
        self._scores = torch.zeros(rows, dtype=torch.float32, device=self.device)
        self.size = 0
        self.seen = 0

    # Public fields are views without the discard row.
    @property
    def images(self) -> torch.Tensor:
        return self._images[: self.capacity]

    @property
    def labels(self) -> torch.Tensor:
        return self._labels[: self.capacity]

    @property
    def tasks(self) -> torch.Tensor:
        return self._tasks[: self.capacity]

    @property
    def logits(self) -> torch.Tensor:
        return self._logits[: self.capacity]

    @property
    def scores(self) -> torch.Tensor:
        return self._scores[: self.capacity]

    def __len__(self) -> int:
        return self.size

    def is_full(self) -> bool:
        return self.size >= self.capacity

    # ---------------------------------------------------------------- writing
    def _check_batch(self, images: torch.Tensor, labels: torch.Tensor, tasks: torch.Tensor, logits: torch.Tensor | None) -> int:
        b = images.shape[0]
        if images.dtype != torch.uint8 or tuple(images.shape[1:]) != self.image_shape:
            raise ValueError(f"images must be uint8 [B, {', '.join(map(str, self.image_shape))}], got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (b,) or tasks.shape != (b,):
            raise ValueError(f"labels and tasks must be [{b}], got {tuple(labels.shape)} and {tuple(tasks.shape)}")
        if logits is not None and tuple(logits.shape) != (b, self.n_classes):
            raise ValueError(f"logits must be [{b}, {self.n_classes}], got {tuple(logits.shape)}")
        return b

    def _last_wins(self, targets: torch.Tensor) -> torch.Tensor:
        """Send every write but the last one aimed at each slot to the discard row."""
        order = torch.arange(targets.numel(), device=targets.device)
        last = torch.full((self.capacity + 1,), -1, dtype=torch.int64, device=targets.device)
        last.scatter_reduce_(0, targets, order, reduce="amax")
        return torch.where(last[targets] == order, targets, self.capacity)

    def _write(
        self,
        targets: torch.Tensor,
        images: torch.Tensor,
        labels: torch.Tensor,
        tasks: torch.Tensor,
        logits: torch.Tensor | None,
        scores: torch.Tensor | None,
    ) -> None:
        # targets: slot per row, `capacity` = discard; rows later in the batch win.
        targets = self._last_wins(targets.to(self.device))
        dev = self.device
        self._images.index_copy_(0, targets, images.to(dev, non_blocking=True))
        self._labels.index_copy_(0, targets, labels.to(dev, torch.int64, non_blocking=True))
        self._tasks.index_copy_(0, targets, tasks.to(dev, torch.int64, non_blocking=True))
        # Fresh slots without logits/scores get zeros, never a previous occupant's values.
        if logits is None:
            logits = torch.zeros((targets.numel(), self.n_classes), device=dev)
        self._logits.index_copy_(0, targets, logits.detach().to(dev, torch.float32, non_blocking=True))
        if scores is None:
            scores = torch.zeros(targets.numel(), device=dev)
        self._scores.index_copy_(0, targets, scores.detach().to(dev, torch.float32, non_blocking=True))

    def reservoir_add(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        tasks: torch.Tensor,
        logits: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        """Mammoth's online reservoir rule, applied to the batch in order, vectorised.

        Stream sample n (0-based) goes to slot n while n < capacity; otherwise
        j = floor(u * (n + 1)) with u = torch.rand(B, dtype=float64, generator) (one draw per
        sample of the batch, drawn for every sample) and slot j is replaced if j < capacity.
        """
        b = self._check_batch(images, labels, tasks, logits)
        g = _check_generator(generator, self.device)
        u = torch.rand(b, dtype=torch.float64, generator=g, device=self.device)
        n = torch.arange(self.seen, self.seen + b, device=self.device)
        j = torch.minimum(torch.floor(u * (n + 1)).to(torch.int64), n)
        slot = torch.where(n < self.capacity, n, j)
        slot = torch.where(slot < self.capacity, slot, self.capacity)
        self._write(slot, images, labels, tasks, logits, None)
        self.seen += b
        self.size = min(self.capacity, self.seen)

    def uncertainty_walk(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        tasks: torch.Tensor,
        scores: torch.Tensor,
        class_counts: torch.Tensor,
        generator: torch.Generator,
        order: str = "desc",
        logits: torch.Tensor | None = None,
        candidate: str = "advance",
        start: int = 0,
    ) -> torch.Tensor:
        """PBR's end-of-task walk over the task just learned. Returns the accept mask [B]
        (input order; an accepted sample may be overwritten later in the same walk).

        The samples are walked in `order` of `scores` ("desc": most uncertain first, the
        paper's text; "asc": its Eq.'s arg min; "random": the Ours-Random ablation; "weighted":
        a random order drawn with weights = scores, weighted reservoir sampling's priority). Step N
        (1-based) is accepted iff u_N < min(1, P_N), P from `sample_in_probability` with the
        running counts of the classes seen before this task. Accepted samples fill free slots
        in walk order, then each replaces a uniformly random slot.

        `candidate`: "advance" (every step moves on to the next
        sample) or "hold" (the paper's text: a rejected candidate stays the candidate for the
        next step, so the k-th acceptance stores the k-th sample in walk order). With "advance" and a full buffer the
        walk keeps each sample with probability capacity / (n + offset) whatever its position:
        the product of acceptance and survival telescopes, so the MI order has no effect.

        Draws from `generator` (on `scores`' device), in this order: the permutation (random
        and weighted orders only), u = torch.rand(B, float64), slots = torch.randint(capacity, (B,)).
        """
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        if candidate not in CANDIDATES:
            raise ValueError(f"candidate must be one of {CANDIDATES}, got {candidate!r}")
        b = self._check_batch(images, labels, tasks, logits)
        if scores.shape != (b,):
            raise ValueError(f"scores must be [{b}], got {tuple(scores.shape)}")
        dev = scores.device
        g = _check_generator(generator, dev)
        perm = walk_order(scores, order, g)
        p = sample_in_probability(b, torch.as_tensor(class_counts).to(dev), self.capacity, start)
        u = torch.rand(b, dtype=torch.float64, generator=g, device=dev)
        rand_slot = torch.randint(self.capacity, (b,), generator=g, device=dev)
        accept = u < p.clamp(max=1.0)  # walk order
        rank = torch.cumsum(accept, 0) - 1
        free = self.capacity - self.size
        slot = torch.where(rank < free, self.size + rank, rand_slot)
        slot = torch.where(accept, slot, self.capacity)
        # Once per task, so a host sync is fine: move only the accepted rows to the buffer.
        rows = torch.nonzero(accept).squeeze(1)
        src = perm[: rows.numel()] if candidate == "hold" else perm[rows]
        idx = src.to(images.device)
        self._write(
            slot[rows],
            images[idx],
            labels[src.to(labels.device)],
            tasks[src.to(tasks.device)],
            None if logits is None else logits[src.to(logits.device)],
            scores[src],
        )
        n_accepted = rows.numel()
        self.size = min(self.capacity, self.size + n_accepted)
        accepted = torch.zeros(b, dtype=torch.bool, device=dev)
        accepted[src] = True
        return accepted

    # ---------------------------------------------------------------- reading
    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Indices of min(n, size) filled slots, uniform without replacement."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        g = _check_generator(generator, self.device)
        return torch.randperm(self.size, generator=g, device=self.device)[: min(n, self.size)]

    def get(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(images, labels, tasks, logits) at `indices`."""
        return self.images[indices], self.labels[indices], self.tasks[indices], self.logits[indices]

    # ---------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "size": self.size,
            "seen": self.seen,
            "images": self.images.clone(),
            "labels": self.labels.clone(),
            "tasks": self.tasks.clone(),
            "logits": self.logits.clone(),
            "scores": self.scores.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"state has capacity {state['capacity']}, this buffer {self.capacity}")
        for name in ("images", "labels", "tasks", "logits", "scores"):
            mine = getattr(self, name)
            theirs = state[name]
            if tuple(theirs.shape) != tuple(mine.shape):
                raise ValueError(f"state {name} has shape {tuple(theirs.shape)}, expected {tuple(mine.shape)}")
            mine.copy_(theirs)
        self.size = int(state["size"])
        self.seen = int(state["seen"])
