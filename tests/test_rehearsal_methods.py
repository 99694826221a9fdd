"""iCaRL's herding and nearest-mean classifier, FDR's per-task memory and function distance."""

import torch

from types import SimpleNamespace

from pbr.buffer import Buffer
from pbr.memory import TaskEnd
from pbr.memory.per_task import PerTask
from pbr.selection import herding
from test_methods import _params, _run_tasks, _setup, _task


def test_herding_keeps_the_chosen_mean_nearest_the_class_mean():
    """1-D features 0, 1, 2, 10 (mean 3.25): 2 first (|3.25 - 2| = 1.25), then 1 ((2 + 1) / 2 = 1.5
    beats (2 + 0) / 2 = 1 and (2 + 10) / 2 = 6), then 10 ((3 + 10) / 3 = 4.33 beats 3 / 3 = 1)."""
    f = torch.tensor([[0.0], [1.0], [2.0], [10.0]])
    assert herding(f, 3).tolist() == [2, 1, 3]
    assert herding(f, 9).tolist() == [2, 1, 3, 0]  # never more than the class has, each once


def _images(ids):
    return torch.tensor(ids, dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, 2, 2).contiguous()


def test_per_task_memory_splits_the_capacity_equally_and_keeps_each_old_tasks_first_samples():
    buf = Buffer(6, (3, 2, 2), n_classes=4)
    memory = PerTask(buf, torch.Generator().manual_seed(0))
    # The learner's logits on each task's samples: zeros on task 0's, ones on task 1's.
    learner = SimpleNamespace(memory_logits=lambda images: (images[:, :1, 0, 0] >= 100).float().expand(-1, 4))
    memory.end_task(TaskEnd(learner, 0, _images(range(10)), torch.zeros(10, dtype=torch.int64)))
    first = buf.images[:6, 0, 0, 0].tolist()
    assert len(buf) == 6 and len(set(first)) == 6
    memory.end_task(TaskEnd(learner, 1, _images(range(100, 110)), torch.ones(10, dtype=torch.int64)))
    assert len(buf) == 6 and buf.tasks[:6].tolist() == [0, 0, 0, 1, 1, 1]
    assert buf.images[:3, 0, 0, 0].tolist() == first[:3]  # task 0 keeps its first three
    assert all(v >= 100 for v in buf.images[3:6, 0, 0, 0].tolist())
    assert buf.logits[3:6].eq(1).all() and buf.logits[:3].eq(0).all()  # each sample keeps its own outputs


def test_icarl_memory_is_class_balanced_and_its_nearest_mean_classifier_uses_it():
    method, ctx = _setup("icarl", n_classes=4, n_tasks=2, buffer_size=8)
    seen = _run_tasks(method, ctx, n_tasks=2)
    labels = method.buffer.labels[: len(method.buffer)]
    assert torch.bincount(labels, minlength=4).tolist() == [2, 2, 2, 2]  # 8 // 4 classes
    # An exemplar is nearest its own class's mean when that class holds it alone.
    n = len(method.buffer)
    method.net.eval()
    with torch.no_grad():
        x = ctx.preprocess(method.buffer.images[:n])
        feats = method.net.features(x)
        method.class_means = torch.stack([feats[0], feats[2], feats[4], feats[6]])
        scores = method.predict(x[[0, 2, 4, 6]])
    assert scores.argmax(1).tolist() == [0, 1, 2, 3]
    assert torch.allclose(scores.diagonal(), torch.zeros(4), atol=1e-4)  # distance 0 to its own mean
    assert len(seen) == 2


def test_icarl_trains_on_the_task_and_the_whole_memory():
    method, ctx = _setup("icarl", n_classes=4, n_tasks=2, buffer_size=8)
    seen = _run_tasks(method, ctx, n_tasks=1)
    images, labels = method.task_data(1, seen + [_task(1)])
    assert images.shape[0] == _task(1)[0].shape[0] + 8 and set(labels[-8:].tolist()) == {0, 1}


def test_fdr_takes_a_second_step_on_the_memory_weighted_by_alpha():
    """alpha 0: the memory step moves nothing, so the weights are plain SGD's."""
    fdr, ctx = _setup("fdr", alpha=0.0, buffer_size=8)
    _run_tasks(fdr, ctx, n_tasks=1)
    sgd, _ = _setup("sgd", lr=fdr.opts.lr)
    sgd.net.load_state_dict(fdr.net.state_dict())
    images, labels = _task(1)
    fdr.begin_task(1, images, labels)
    sgd.begin_task(1, images, labels)
    x = ctx.augment(images[:8], torch.Generator().manual_seed(1))
    fdr.observe(x, labels[:8], images[:8])
    sgd.observe(x, labels[:8], images[:8])
    assert torch.allclose(_params(fdr.net), _params(sgd.net), atol=1e-6)
    fdr.opts.alpha = 1.0
    before = _params(fdr.net)
    sgd.observe(x, labels[:8], images[:8])
    fdr.observe(x, labels[:8], images[:8])
    assert not torch.allclose(_params(fdr.net), _params(sgd.net), atol=1e-6)
    assert not torch.equal(before, _params(fdr.net))


def test_hal_ring_keeps_each_tasks_latest_samples():
    """capacity 8 // 2 tasks = 4 slots a task, each holding its task's latest 4 samples, in order."""
    method, ctx = _setup("hal", n_classes=4, n_tasks=2, buffer_size=8, hal_memory="ring")
    for t in (0, 1):
        images, labels = _task(t)
        method.begin_task(t, images, labels)
        method.begin_epoch(0)
        for i in range(0, 24, 8):  # 24 samples: the ring wraps after 4
            method.observe(ctx.augment(images[i:i + 8], ctx.generator), labels[i:i + 8], images[i:i + 8])
        if t == 0:
            method.end_task(0, images, labels)
        stored = sorted(map(tuple, method.buffer.images[4 * t:4 * t + 4].flatten(1)[:, :6].tolist()))
        assert stored == sorted(map(tuple, images[20:24].flatten(1)[:, :6].tolist()))
    assert len(method.buffer) == 8 and method.buffer.tasks[:8].tolist() == [0] * 4 + [1] * 4


def test_hals_memory_by_default_is_one_reservoir_over_the_stream_as_mammoth_runs_it():
    """A long-tailed stream, 200 samples of task 0 then 10 of task 1, capacity 20: a ring per task
    gives task 1 10 slots (all its samples); Mammoth's hal @5bb9275 keeps one reservoir, where each
    task-1 sample enters with probability 20 / (n + 1), about 1 slot in all (over 5: p < 1e-3)."""
    held = {}
    for memory in ("reservoir", "ring"):
        method, ctx = _setup("hal", n_classes=4, n_tasks=2, buffer_size=20, hal_memory=memory)
        for t, n in ((0, 200), (1, 10)):
            images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(t))
            labels = 2 * t + torch.arange(n) % 2
            method.begin_task(t, images, labels)
            method.begin_epoch(0)
            method.offer(images, labels)
        held[memory] = int((method.buffer.tasks[: len(method.buffer)] == 1).sum())
        assert len(method.buffer) == 20
    assert held["ring"] == 10 and held["reservoir"] <= 5, held


def test_hals_ring_is_offered_the_epochs_the_reservoirs_rule_says():
    """method.reservoir reaches HAL's ring as every online memory: with first_epoch a task's later
    epochs are not offered, so a ring of 10 holds the first epoch's 8 samples once; with every_epoch
    it keeps the latest 10 of the three epochs' 24, repeats included."""
    for rule, seen, size in (("every_epoch", 24, 10), ("first_epoch", 8, 8)):
        method, ctx = _setup("hal", n_classes=4, n_tasks=2, buffer_size=20, hal_memory="ring", reservoir=rule)
        images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        labels = torch.arange(8) % 2
        method.begin_task(0, images, labels)
        for epoch in range(3):
            method.begin_epoch(epoch)
            method.offer(images, labels)
        assert (method.policy.seen, len(method.buffer)) == (seen, size), rule


def test_hal_anchor_is_forgotten_by_the_memory_step_more_than_its_start():
    import copy

    import torch.nn.functional as F

    from pbr.methods.hal import learn_anchor

    method, ctx = _setup("hal", n_classes=4, n_tasks=2, buffer_size=8)
    _run_tasks(method, ctx, n_tasks=1)
    theta = method.net
    spare = copy.deepcopy(theta)
    with torch.no_grad():
        for p in spare.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    start = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(4))
    before = _params(theta)

    def gap(e):  # what the anchor search raises: the fine-tuned model's loss minus the current one's
        theta.eval()
        spare.eval()
        with torch.no_grad():
            t = torch.tensor([1])
            return (F.cross_entropy(spare(e[None]), t) - F.cross_entropy(theta(e[None]), t)).item()

    anchor = learn_anchor(theta, spare, 1, None, 0.1, 0.1, start, steps=20)
    assert gap(anchor) > gap(start) + 1e-3
    assert torch.equal(before, _params(theta))  # the networks are left as they were


def test_hal_with_lambda_zero_takes_ers_step_from_the_same_state():
    """The temporary step is undone: with no drift term HAL's update is the plain CE step."""
    import copy

    hal, ctx = _setup("hal", n_classes=4, n_tasks=2, buffer_size=8, hal_lambda=0.0)
    _run_tasks(hal, ctx, n_tasks=1)
    images, labels = _task(1)
    hal.begin_task(1, images, labels)
    hal.begin_epoch(0)
    ref = copy.deepcopy(hal.net)
    x = ctx.augment(images[:8], torch.Generator().manual_seed(9))
    state = ctx.generator.get_state()
    bx, by, _ = hal.replay()  # the memory batch the step will draw
    ctx.generator.set_state(state)
    hal.observe(x, labels[:8], images[:8])
    opt = torch.optim.SGD(ref.parameters(), lr=hal.opts.lr)
    torch.nn.functional.cross_entropy(ref(torch.cat([x, bx])), torch.cat([labels[:8], by])).backward()
    opt.step()
    assert hal.anchors is not None and torch.allclose(_params(hal.net), _params(ref), atol=1e-6)


def test_hal_refuses_a_buffer_smaller_than_its_tasks_in_one_line():
    import pytest

    from pbr.errors import UserError

    with pytest.raises(UserError, match=r"method.buffer_size = 1 leaves HAL's per-task ring empty"):
        _setup("hal", n_classes=4, n_tasks=2, buffer_size=1, hal_memory="ring")


# Mammoth utils/best_args.py @5bb9275, transcribed by hand: (lr, and the method's own keys) per
# dataset and buffer size (-1: every buffer). The published best is what `auto` promises.
BEST_ARGS = {
    ("sgd", "cifar10", 200): {"lr": 0.1},  # seq-cifar10 sgd {-1: lr 0.1}
    ("sgd", "tinyimagenet", 200): {"lr": 0.03},  # seq-tinyimg sgd {-1: lr 0.03}
    ("sgd", "cifar100", 500): {"lr": 0.03},  # seq-cifar100 sgd {-1: lr 0.03}
    ("hal", "cifar10", 200): {"lr": 0.03, "hal_lambda": 0.2, "hal_beta": 0.5, "hal_gamma": 0.1},
    ("hal", "cifar10", 500): {"lr": 0.03, "hal_lambda": 0.1, "hal_beta": 0.3, "hal_gamma": 0.1},
    ("hal", "cifar10", 5120): {"lr": 0.03, "hal_lambda": 0.1, "hal_beta": 0.3, "hal_gamma": 0.1},
    ("gem", "cifar10", 500): {"lr": 0.03, "margin": 0.5},  # Mammoth's gamma
    ("gss", "cifar10", 5120): {"lr": 0.03},
    ("lwf", "cifar10", 200): {"lr": 0.01, "alpha": 3.0, "weight_decay": 5e-4},
    ("lwf", "tinyimagenet", 200): {"lr": 0.01, "alpha": 1.0, "weight_decay": 5e-4},
    ("der", "cifar10", 200): {"lr": 0.03, "alpha": 0.3},
    ("derpp", "cifar10", 500): {"lr": 0.03, "alpha": 0.2, "beta": 0.5},
    ("icarl", "tinyimagenet", 500): {"lr": 0.03, "weight_decay": 1e-5},
}
# Seq-CIFAR-100: datasets/seq_cifar100.py get_scheduler @5bb9275 trains every task under
# MultiStepLR([35, 45], gamma 0.1) of 50 epochs, so its best_args carry lr_milestones 0.7, 0.9.
# best_args lists buffers 500 and 2000 there, no 200: 200 takes 500's values (one setting a Table 2 row).
SEQ_CIFAR100 = {
    "sgd": {"lr": 0.03},  # sgd {-1: lr 0.03}
    "lwf": {"lr": 0.03, "alpha": 0.5, "weight_decay": 5e-4},  # lwf {-1: lr 0.03, optim_wd 5e-4}; alpha: models/lwf.py's default
    "er": {"lr": 0.1},  # er {500: lr 0.1}
    "prs": {"lr": 0.1},  # ER's step, ER's values
    "cbrs": {"lr": 0.1},
    "icarl": {"lr": 0.3, "weight_decay": 1e-5},  # icarl {500: lr 0.3, optim_wd 1e-5}
    "der": {"lr": 0.03, "alpha": 0.3},  # der {500: lr 0.03, alpha 0.3}
    "derpp": {"lr": 0.03, "alpha": 0.1, "beta": 0.5},  # derpp {500: lr 0.03, alpha 0.1, beta 0.5}
}
for _name, _values in SEQ_CIFAR100.items():
    for _buffer in (200, 500):
        BEST_ARGS[(_name, "cifar100", _buffer)] = {**_values, "lr_milestones": (0.7, 0.9)}


def test_auto_settings_are_mammoths_best_args():
    """Also the lr schedule: Seq-CIFAR-100's best_args were tuned under its scheduler, which they
    carry; Seq-CIFAR-10 and Seq-TinyImageNet have none (get_scheduler returns None): a constant lr."""
    from pbr.methods import METHODS

    for (name, dataset, buffer), expected in BEST_ARGS.items():
        opts, sources = METHODS[name].options(dataset, buffer)
        got = {k: getattr(opts, k) for k in expected}
        assert got == expected, (name, dataset, buffer)
        assert all("best_args" in sources[k] for k in expected), (name, dataset, buffer, sources)
        if dataset == "cifar100":
            assert "datasets/seq_cifar100.py get_scheduler" in sources["lr_milestones"], (name, buffer)
            assert ("best_args has no 200" in sources["lr"]) == (buffer == 200 and name not in ("sgd", "lwf"))
        else:
            assert opts.lr_milestones == (), (name, dataset, buffer)
