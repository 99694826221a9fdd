"""SGD: plain fine-tuning on each task in turn (the interface's default step), the lower bound.

`auto` lr is Mammoth's published best where it has one (seq-cifar10: 0.1, the lower bound of the
paper's Table 2); elsewhere the paper's common protocol (0.03, which is also Mammoth's seq-tinyimg
and seq-cifar100 value).
"""

from pbr.methods.base import MAMMOTH, SEQ_CIFAR100, SEQ_CIFAR100_SCHEDULE, Best, ContinualMethod


class SGD(ContinualMethod):
    name = "sgd"
    role = "bound"
    grids = ("table5",)  # the ablation's no-buffer rows, with either classifier
    label = "SGD"
    laned = True  # tests/test_lockstep.py
    best = (
        Best("cifar10", None, {"lr": 0.1}, f"{MAMMOTH} seq-cifar10"),
        Best("tinyimagenet", None, {"lr": 0.03}, f"{MAMMOTH} seq-tinyimg"),
        Best("cifar100", None, {"lr": 0.03, **SEQ_CIFAR100_SCHEDULE}, SEQ_CIFAR100),
    )
