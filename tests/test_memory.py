"""The memory-policy interface (pbr/memory/): counters kept by hand on tiny streams, resumes that go
on exactly, and a training step paired with another policy by its `memory` attribute alone."""

import io
from types import SimpleNamespace

import pytest
import torch

from pbr.buffer import Buffer
from pbr.loop import fit_task
from pbr.memory import Memory, TaskEnd
from pbr.memory.cbrs import ClassBalancingReservoir
from pbr.memory.herding import ClassHerding
from pbr.memory.prs import PartitioningReservoir
from pbr.memory.reservoir import Reservoir
from pbr.memory.ring import TaskRing
from pbr.methods import METHODS
from pbr.methods.er import ER
from pbr.selection import herding
from test_methods import _run_tasks, _setup, _task

SHAPE = (1, 1, 1)


def _ids(ids, n_classes=4):
    """A batch whose images and labels encode stream ids (label = id % n_classes)."""
    ids = torch.as_tensor(ids)
    return ids.to(torch.uint8).view(-1, 1, 1, 1), ids % n_classes, torch.zeros_like(ids)


def _stored(buffer):
    return buffer.images[: buffer.size, 0, 0, 0].tolist()


def _as(cls):
    """ER's test setup (buffer 16, two tasks of two classes) built as `cls`."""
    method, ctx = _setup("er")
    return cls(method.net, ctx, method.opts), ctx


def _two_tasks():
    """A learner as a ring reads it: two tasks."""
    return SimpleNamespace(ctx=SimpleNamespace(task_classes=[torch.tensor([0, 1]), torch.tensor([2, 3])]))


def test_reservoir_counts_a_tiny_stream_by_hand():
    """Capacity 3, stream 0..4 in batches of 2 and 3: 0, 1, 2 fill slots 0-2; sample n = 3, 4 then
    goes to slot floor(u * (n + 1)) when that is below 3 (u: the policy's draw for the sample)."""
    g = torch.Generator().manual_seed(3)
    replay = torch.Generator().manual_seed(3)
    memory = Reservoir(Buffer(3, SHAPE, n_classes=4), g)
    memory.offer(*_ids([0, 1]))
    torch.rand(2, dtype=torch.float64, generator=replay)  # drawn for every sample, unread while slots are free
    assert (memory.seen, memory.buffer.size, _stored(memory.buffer)) == (2, 2, [0, 1])
    memory.offer(*_ids([2, 3, 4]))
    u = torch.rand(3, dtype=torch.float64, generator=replay).tolist()
    expect = [0, 1, 2]
    for n, un in ((3, u[1]), (4, u[2])):
        j = int(un * (n + 1))
        if j < 3:
            expect[j] = n
    assert (memory.seen, memory.buffer.size, _stored(memory.buffer)) == (5, 3, expect)


def test_ring_counts_a_tiny_stream_by_hand():
    """Capacity 6 over two tasks: 3 slots a task. Task 0 offers 0..4 (slots k % 3: 0 1 2 0 1, so
    3 and 4 overwrite 0 and 1); task 1's ring starts after it and holds 10, 11."""
    memory = TaskRing(Buffer(6, SHAPE, n_classes=4), torch.Generator(), _two_tasks())
    memory.begin_task(0)
    memory.offer(*_ids([0, 1]))
    memory.offer(*_ids([2, 3, 4]))
    assert (memory.seen, memory.buffer.size, _stored(memory.buffer)) == (5, 3, [3, 4, 2])
    memory.begin_task(1)
    memory.offer(*_ids([10, 11]))
    assert (memory.seen, memory.buffer.size, _stored(memory.buffer)) == (7, 5, [3, 4, 2, 10, 11])
    memory.begin_task(1)  # a task begun again (a resume) keeps its ring
    memory.offer(*_ids([12, 13]))
    assert _stored(memory.buffer) == [3, 4, 2, 13, 11, 12]


def test_a_policy_ignores_the_call_it_does_not_use():
    """An online policy leaves the memory alone at a task's end; an end-of-task one ignores offers
    (and draws nothing)."""
    g = torch.Generator().manual_seed(0)
    online = Reservoir(Buffer(4, SHAPE, n_classes=4), g)
    online.offer(*_ids([5, 6]))
    state = g.get_state()
    online.end_task(TaskEnd(None, 0, *_ids([7, 8])[:2]))
    herd = ClassHerding(Buffer(4, SHAPE, n_classes=4), g)
    herd.offer(*_ids([7, 8]))
    assert _stored(online.buffer) == [5, 6] and herd.buffer.size == 0 and herd.seen == 0
    assert torch.equal(g.get_state(), state)


def test_task_end_asks_the_learner_once_for_what_a_policy_reads():
    calls = []

    def features(images):
        calls.append(images.shape[0])
        return images.float().flatten(1)

    end = TaskEnd(SimpleNamespace(memory_features=features), 0, *_ids([1, 2, 3])[:2])
    assert torch.equal(end.features, end.features) and calls == [3]


POLICIES = {
    "reservoir": lambda g: Reservoir(Buffer(5, SHAPE, n_classes=4), g),
    "prs": lambda g: PartitioningReservoir(Buffer(5, SHAPE, n_classes=4), g, rho=1.0),
    "cbrs": lambda g: ClassBalancingReservoir(Buffer(5, SHAPE, n_classes=4), g),
    "ring": lambda g: TaskRing(Buffer(6, SHAPE, n_classes=4), g, _two_tasks()),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_state_dict_round_trip_goes_on_as_if_never_stopped(name):
    """Half a stream, a save through torch.save, a fresh policy loaded from it: the second half
    leaves it exactly as the policy that never stopped (storage and counters)."""
    stream = [list(range(i, i + 3)) for i in range(0, 30, 3)]
    g = torch.Generator().manual_seed(1)
    whole = POLICIES[name](g)
    whole.begin_task(0)
    for ids in stream[:5]:
        whole.offer(*_ids(ids))
    blob = io.BytesIO()
    torch.save(whole.state_dict(), blob)
    blob.seek(0)
    g2 = torch.Generator()
    g2.set_state(g.get_state())
    resumed = POLICIES[name](g2)
    resumed.load_state_dict(torch.load(blob))
    for memory in (whole, resumed):
        memory.begin_task(1)
        for ids in stream[5:]:
            memory.offer(*_ids(ids))
    a, b = whole.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and whole.seen == 30
    for key in a:
        assert torch.equal(a[key], b[key]) if torch.is_tensor(a[key]) else a[key] == b[key], key


def test_every_rehearsal_method_names_a_policy_that_holds_its_counters():
    for name, cls in METHODS.items():
        if not cls.uses_buffer:
            assert cls.memory is None
            continue
        method, ctx = _setup(name)
        _run_tasks(method, ctx)
        assert type(method.policy) is cls.memory and isinstance(method.policy, Memory), name
        state = method.state_dict()
        assert state["buffer"]["seen"] == method.policy.seen and state["buffer"]["size"] == len(method.buffer)
        again, _ = _setup(name)
        again.load_state_dict(state)
        mine, theirs = method.policy.state_dict(), again.policy.state_dict()
        assert mine.keys() == theirs.keys(), name
        for key in mine:
            same = torch.equal(mine[key], theirs[key]) if torch.is_tensor(mine[key]) else mine[key] == theirs[key]
            assert same, (name, key)


class _Offers:
    """Mixed into a policy: records every batch offered."""

    def offer(self, images, labels, tasks, logits=None):
        self.log.append((int(tasks[0]), images[:, 0, 0, 0].tolist()))
        super().offer(images, labels, tasks, logits)


def test_er_with_hals_ring_by_one_attribute_fills_each_tasks_ring_with_its_latest_samples():
    class RecordedRing(_Offers, TaskRing):
        log: list = []

    class ERWithRing(ER):
        memory = RecordedRing

    method, ctx = _as(ERWithRing)  # buffer 16 over two tasks: 8 slots a task
    _run_tasks(method, ctx)
    assert isinstance(method.policy, TaskRing)
    stored = method.buffer.images[:, 0, 0, 0].tolist()
    for t in (0, 1):
        offered = [v for task, batch in RecordedRing.log if task == t for v in batch]
        assert len(offered) == 24  # ER offers each batch once (one epoch)
        ring = [None] * 8
        for k, v in enumerate(offered):
            ring[k % 8] = v
        assert stored[8 * t: 8 * t + 8] == ring, t
    assert method.buffer.tasks.tolist() == [0] * 8 + [1] * 8 and method.policy.seen == 48


def test_er_with_icarls_herding_by_one_attribute_keeps_each_classs_herding_choice():
    class ERWithHerding(ER):
        memory = ClassHerding

    method, ctx = _as(ERWithHerding)
    images, labels = _task(0)
    method.begin_task(0, images, labels)
    fit_task(method, images, labels, 1, 8)
    assert len(method.buffer) == 0  # offered every batch; herding ignores offers
    method.end_task(0, images, labels)
    feats = method.memory_features(images)  # the network as herding saw it
    expect = []
    for c in (0, 1):  # 16 slots // 2 classes seen: 8 a class, its herding order
        idx = torch.nonzero(labels == c).squeeze(1)
        expect.append(images[idx[herding(feats[idx], 8)]])
    assert torch.equal(method.buffer.images[:16], torch.cat(expect)) and method.policy.seen == 0
