import math

import numpy as np
import pytest
import torch

from pbr.metrics import acc, bwt, forgetting, task_accuracy

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
