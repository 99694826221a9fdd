"""Training progress: a bar per task on a terminal, one plain line per epoch elsewhere (DVC queue logs)."""

from __future__ import annotations

import sys
import time


def _fmt(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class TaskProgress:
    def __init__(self, task: int, n_tasks: int, epochs: int, n_images: int, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.task, self.n_tasks, self.epochs, self.n_images = task, n_tasks, epochs, n_images
        self.t0 = self.t_epoch = time.perf_counter()
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=epochs * n_images, unit="img", unit_scale=True, file=self.stream,
                            desc=f"task {task + 1}/{n_tasks}", dynamic_ncols=True)

    def on_batch(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def on_epoch(self, s) -> None:
        now = time.perf_counter()
        if self.bar is not None:
            self.bar.set_postfix(epoch=f"{s.epoch + 1}/{self.epochs}", loss=f"{s.loss:.3f}",
                                 acc=f"{100 * s.accuracy:.1f}%")
        else:
            rate = s.images / max(now - self.t_epoch, 1e-9)
            left = (now - self.t0) / (s.epoch + 1) * (self.epochs - s.epoch - 1)
            print(f"task {self.task + 1}/{self.n_tasks} epoch {s.epoch + 1}/{self.epochs}: loss {s.loss:.4f} "
                  f"train acc {100 * s.accuracy:.1f}% | {rate:.0f} img/s | task left {_fmt(left)}",
                  file=self.stream, flush=True)
        self.t_epoch = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
