"""JOINT: all tasks' data in one training run, the upper bound (Mammoth's protocol).

Nothing is learned until the last task; then the network trains on the union of every task.
The accuracy rows before the last task therefore show the untrained network; only the final
row (ACC) is meaningful.
"""

import torch

from pbr.methods.base import ContinualMethod


class Joint(ContinualMethod):
    name = "joint"
    role = "bound"
    label = "JOINT"
    learns_each_task = False

    def task_data(self, task, seen):
        if task < len(self.ctx.task_classes) - 1:
            images, labels = seen[task]
            return images[:0], labels[:0]
        return torch.cat([s[0] for s in seen]), torch.cat([s[1] for s in seen])
