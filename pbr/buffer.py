"""Fixed-capacity replay storage; the policies that choose what it keeps are in pbr/memory/.

Storage is preallocated with one spare "discard" row after the last slot: writes that must not
land (rejected samples, samples overwritten later in the same batch) are routed there, so a
batch is written with one index_copy_ and no host sync.
"""

from __future__ import annotations

from typing import Any

import torch

from pbr.rng import check_generator



class Buffer:
    """Replay memory. `images` uint8 [cap, C, H, W], `labels`/`tasks` int64 [cap],
    `logits` float32 [cap, n_classes], `scores` float32 [cap]; slots [0, size) are filled, `size`
    a host int.

    Storage only: what goes where, and `size`, are a memory policy's (pbr/memory/) to write."""

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

    # ---------------------------------------------------------------- writing
    def check_batch(self, images: torch.Tensor, labels: torch.Tensor, tasks: torch.Tensor, logits: torch.Tensor | None) -> int:
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

    def write(
        self,
        targets: torch.Tensor,
        images: torch.Tensor,
        labels: torch.Tensor,
        tasks: torch.Tensor,
        logits: torch.Tensor | None = None,
        scores: torch.Tensor | None = None,
    ) -> None:
        """Store row i of the batch in slot targets[i]; a target of `capacity` (or more) drops the
        row, and when two rows aim at one slot the later one wins. `size` is the policy's to set:
        the slots [0, size) are the filled ones."""
        self.check_batch(images, labels, tasks, logits)
        targets = self._last_wins(targets.to(self.device).clamp(max=self.capacity))
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

    # ---------------------------------------------------------------- reading
    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Indices of min(n, size) filled slots, uniform without replacement."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        g = check_generator(generator, self.device)
        return torch.randperm(self.size, generator=g, device=self.device)[: min(n, self.size)]

    def get(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(images, labels, tasks, logits) at `indices`."""
        return self.images[indices], self.labels[indices], self.tasks[indices], self.logits[indices]

    # ---------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "size": self.size,
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
