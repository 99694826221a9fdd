import math

import numpy as np
import pytest
import torch

from pbr.loop import task_accuracy
from pbr.metrics import acc, bwt, forgetting

NAN = float("nan")


def test_hand_made_matrix():
    R = [[0.9, NAN, NAN], [0.6, 0.8, NAN], [0.5, 0.7, 0.95]]
    assert acc(R) == pytest.approx((0.5 + 0.7 + 0.95) / 3)
    assert bwt(R) == pytest.approx(((0.5 - 0.9) + (0.7 - 0.8)) / 2)
    assert forgetting(R) == pytest.approx(((0.9 - 0.5) + (0.8 - 0.7)) / 2)


def test_forgetting_takes_max_over_intermediate_tasks():
    # task 0 peaks after task 1 (0.7), not on the diagonal; task 1 improves at the end.
    R = np.array([[0.5, NAN, NAN], [0.7, 0.8, NAN], [0.6, 0.9, 0.9]])
    assert forgetting(R) == pytest.approx(((0.7 - 0.6) + (0.8 - 0.9)) / 2)
    assert bwt(R) == pytest.approx(((0.6 - 0.5) + (0.9 - 0.8)) / 2)
    assert isinstance(forgetting(R), float) and isinstance(acc(R), float)


def test_single_task():
    assert acc([[0.4]]) == pytest.approx(0.4)
    assert bwt([[0.4]]) == 0.0 and forgetting([[0.4]]) == 0.0


def test_non_square_rejected():
    with pytest.raises(ValueError):
        acc([[0.1, 0.2]])
    with pytest.raises(ValueError, match="non-empty"):  # not an IndexError from inside
        acc(np.zeros((0, 0)))


def test_task_accuracy_masks():
    logits = torch.tensor(
        [
            [1.0, 5.0, 2.0, 0.0],  # label 2: best overall 1; among {2,3} -> 2
            [3.0, 1.0, 9.0, 4.0],  # label 0: best overall 2; among {0,1} -> 0
            [0.0, 2.0, 1.0, 8.0],  # label 1: best overall 3; among {0,1} -> 1
        ]
    )
    labels = torch.tensor([2, 0, 1])
    seen = torch.tensor([0, 1])
    assert task_accuracy(logits, labels, seen, "class_il").item() == 2
    assert task_accuracy(logits, labels, torch.arange(4), "class_il").item() == 0
    n = task_accuracy(logits, labels, torch.tensor([2, 3]), "task_il")
    assert n.dtype == torch.int64 and n.item() == 1
    with pytest.raises(ValueError):
        task_accuracy(logits, labels, seen, "domain_il")
    assert not math.isnan(float(n))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_task_accuracy_on_cuda_with_host_classes():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]], device="cuda")
    n = task_accuracy(logits, torch.tensor([2, 0], device="cuda"), torch.tensor([0, 2]), "task_il")
    assert n.device.type == "cuda" and int(n) == 2


def test_minority_tasks_and_scenario_metrics_by_hand():
    from pbr.metrics import minority_tasks, scenario_metrics

    # Seq-CIFAR-10-LT's task sizes: the three smallest are the last three (the paper's Table 4).
    assert minority_tasks([7997, 2873, 1032, 371, 133]) == [2, 3, 4]
    # Equal sizes: the later tasks count as the minority.
    assert minority_tasks([5, 5, 5, 5]) == [2, 3]
    m = scenario_metrics([[90.0, float("nan")], [60.0, 80.0]], [1])
    assert m == {"acc": 70.0, "bwt": -30.0, "forgetting": 30.0, "minority_acc": 80.0}
    # The task not learned yet as training writes it (None: not evaluated) reads alike.
    assert scenario_metrics([[90.0, None], [60.0, 80.0]], [1]) == m
    # Three tasks, where forgetting is not -BWT: task 0 peaks after task 1 (70, not its 50 on the
    # diagonal), so it forgot 10 while its BWT is +10; task 1 forgot nothing (80 -> 90).
    m = scenario_metrics([[50.0, NAN, NAN], [70.0, 80.0, NAN], [60.0, 90.0, 90.0]], [1, 2])
    assert m == pytest.approx({"acc": 80.0, "bwt": 10.0, "forgetting": 0.0, "minority_acc": 90.0})


def test_the_training_loops_evaluation_masks_each_tasks_own_classes_where_they_are_not_contiguous():
    """A shuffled stream's tasks hold scattered classes (task 0: 3 and 0; task 1: 1 and 2). A model
    that always prefers 0 > 3 > 1 > 2, by hand: Class-IL predicts 0 (among the seen classes), right
    on half of task 0 and none of task 1; Task-IL predicts 0 in task 0 and 1 in task 1, half right
    in each. Masking consecutive ids instead ({0, 1}, {2, 3}) reads task 1 at 0 in Task-IL."""
    from pbr.data.augment import Augment, normalize
    from pbr.loop import evaluate
    from pbr.methods import METHODS, Context
    from pbr.models import Net

    mean, std = (0.5,) * 3, (0.25,) * 3
    sgd = METHODS["sgd"]

    class Prefers(sgd):
        def predict(self, x, task=None):
            return torch.tensor([3.0, 1.0, 0.0, 2.0]).expand(x.shape[0], 4)

    ctx = Context(4, [torch.tensor([3, 0]), torch.tensor([1, 2])], torch.device("cpu"), Augment(mean, std),
                  lambda x: normalize(x, mean, std), torch.Generator().manual_seed(0), replay_batch_size=8)
    method = Prefers(Net(4, width=4, head="linear", dropout=0.0), ctx, sgd.options("cifar10", 16)[0])
    images = torch.zeros(4, 3, 32, 32, dtype=torch.uint8)
    tests = [(images, torch.tensor([0, 0, 3, 3])), (images, torch.tensor([1, 1, 2, 2]))]
    for seen in (1, 2):  # batches of 3 across the 4 images: the counts add up over batches
        assert evaluate(method, tests, seen, batch_size=3) == ([50.0, 0.0], [50.0, 50.0])
