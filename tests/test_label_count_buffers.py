"""PRS and CBRS: the memory policies that balance classes from the stream's label counts."""

import random

import pytest
import torch

from pbr.buffer import Buffer
from pbr.memory.cbrs import ClassBalancingReservoir
from pbr.memory.prs import PartitioningReservoir
from test_methods import _run_tasks, _setup

POLICIES = {"prs": PartitioningReservoir, "cbrs": ClassBalancingReservoir}


def _policy(name, capacity, **opts):
    return POLICIES[name](Buffer(capacity, (3, 1, 1), n_classes=4), torch.Generator(), **opts)

COUNTS = {0: 400, 1: 100, 2: 10, 3: 3}  # a long-tailed stream of known counts


def _stream(name, seed, ordered=False, **opts):
    policy = _policy(name, 40, **opts)
    rng = random.Random(seed)
    head = [c for c in (0, 1) for _ in range(COUNTS[c])]
    tail = [c for c in (2, 3) for _ in range(COUNTS[c])]
    if ordered:  # task 0 (classes 0, 1), then task 1 (classes 2, 3)
        rng.shuffle(head)
        rng.shuffle(tail)
        stream = head + tail
    else:
        stream = head + tail
        rng.shuffle(stream)
    for label in stream:
        policy.place(label, [rng.random() for _ in range(policy.uniforms)])
    return policy, [policy.slots.count(c) for c in range(4)]


@pytest.mark.parametrize("name,opts", [("cbrs", {}), ("prs", {"rho": 0.0})])
@pytest.mark.parametrize("seed,ordered", [(0, False), (1, False), (2, True)])
def test_balancing_buffers_reach_the_equal_partition(name, opts, seed, ordered):
    """40 slots, 4 classes: the two small classes keep every sample (10 + 3), the two large ones
    split the other 27 slots as equally as they can."""
    _, stored = _stream(name, seed, ordered, **opts)
    assert stored[2:] == [10, 3]
    assert sorted(stored[:2]) == [13, 14]


def test_prs_with_rho_one_partitions_as_the_stream():
    """rho = 1: shares 400 / 513 ... of 40 slots = 31.2, 7.8, 0.8, 0.2."""
    for seed in range(3):
        _, stored = _stream("prs", seed, rho=1.0)
        assert stored[0] >= 30 and 4 <= stored[1] <= 10 and stored[2] + stored[3] <= 2, stored


def test_cbrs_full_class_replaces_its_own_with_probability_stored_over_seen():
    policy = _policy("cbrs", 4)
    for _ in range(4):
        policy.place(0, [0.0, 0.0, 0.0])
    assert policy.full == {0}  # the largest class of the full memory
    policy.class_seen[0] = 7  # the next class-0 sample is the 8th: kept with probability 4 / 8
    assert policy.place(0, [0.49, 0.9, 0.0]) == 3  # the slot at u = 0.9 of its 4
    assert policy.place(0, [0.51, 0.0, 0.0]) == 4  # 4 / 9 < 0.51: dropped (slot = capacity)
    # A class that is not full takes a slot of the largest class, whatever the draw.
    assert policy.place(1, [0.99, 0.0, 0.0]) == 0 and policy.slots == [1, 0, 0, 0]


def test_prs_accepts_with_probability_target_over_seen():
    policy = _policy("prs", 4, rho=0.0)
    for label in (0, 0, 1, 1):
        policy.place(label, [0.0, 0.0, 0.0])
    policy.class_seen[0] = 10  # target 4 / 2 classes = 2 slots: accepted with probability 2 / 10
    assert policy.place(0, [0.21, 0.0, 0.0]) == 4
    slot = policy.place(0, [0.18, 0.0, 0.0])  # now 2 / 11 = 0.182
    assert slot < 4 and policy.slots[slot] == 0


def test_prs_lets_a_class_pushed_out_come_back_at_its_last_share():
    """The authors' code (cdjkim/PRS, SubStream.proportion) keeps the share a class had when it was
    last in memory: capacity 3, one sample each of classes 0, 1, 2 (share 1/3 each); a class-3
    sample evicts the class-2 one. The next class-2 sample has target 3 x 1/3 = 1 and n = 1 seen:
    probability 1 (a share of 0 refused it, and every later one, for good)."""
    policy = _policy("prs", 3, rho=0.0)
    for label in (0, 1, 2):
        policy.place(label, [0.0, 0.0, 0.0])
    assert policy.place(3, [0.0, 0.99, 0.0]) == 2 and policy.slots == [0, 1, 3]
    slot = policy.place(2, [0.999, 0.0, 0.0])
    assert slot < 3 and policy.slots[slot] == 2
    # It comes back in a resumed run too: the share is part of the policy's saved state.
    again = _policy("prs", 3, rho=0.0)
    for label in (0, 1, 2):
        again.place(label, [0.0, 0.0, 0.0])
    again.place(3, [0.0, 0.99, 0.0])
    state = again.state_dict()
    resumed = _policy("prs", 3, rho=0.0)
    resumed.buffer.write(torch.arange(3), torch.zeros(3, *resumed.buffer.images.shape[1:], dtype=torch.uint8),
                         torch.tensor([0, 1, 3]), torch.zeros(3, dtype=torch.int64))
    resumed.buffer.size = 3
    resumed.load_state_dict(state)
    assert resumed.place(2, [0.999, 0.0, 0.0]) < 3


@pytest.mark.parametrize("name", ["prs", "cbrs"])
def test_training_keeps_the_host_labels_and_the_buffer_in_step(name):
    method, ctx = _setup(name, buffer_size=8)
    _run_tasks(method, ctx)
    policy = method.policy
    assert isinstance(policy, POLICIES[name])
    assert policy.slots == method.buffer.labels[: len(method.buffer)].tolist()
    assert sum(policy.class_seen) == policy.seen == 48  # each sample offered once (one epoch)
    state = method.state_dict()
    again, _ = _setup(name, buffer_size=8)
    again.load_state_dict(state)
    assert again.policy.slots == policy.slots and again.policy.class_seen == policy.class_seen
    assert getattr(again.policy, "full", None) == getattr(policy, "full", None)
