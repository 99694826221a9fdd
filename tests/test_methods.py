import torch

from pbr.data.augment import Augment, normalize
from pbr.loop import evaluate, fit_task
from pbr.methods import METHODS, Context
from pbr.models import Net

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def _setup(name, n_classes=4, n_tasks=2, buffer_size=16, **opts):
    g = torch.Generator().manual_seed(0)
    cls = METHODS[name]
    head = cls.defaults["head"]
    net = Net(n_classes, width=4, head=head, dropout=cls.defaults["dropout"], generator=torch.Generator().manual_seed(1))
    per = n_classes // n_tasks
    ctx = Context(n_classes, [torch.arange(t * per, (t + 1) * per) for t in range(n_tasks)], torch.device("cpu"),
                  Augment(MEAN, STD), lambda x: normalize(x, MEAN, STD), g, replay_batch_size=8)
    if "mc_samples" in cls.setting_keys():
        opts.setdefault("mc_samples", 4)
    o, _ = cls.options("cifar10", buffer_size, **opts)
    return cls(net, ctx, o), ctx


def _task(t, n=24, per=2, seed=0):
    g = torch.Generator().manual_seed(seed + t)
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = t * per + torch.arange(n) % per
    return images, labels


def _params(net):
    return torch.cat([p.detach().flatten().clone() for p in net.parameters()])


def _run_tasks(method, ctx, n_tasks=2, epochs=1):
    seen = [_task(t) for t in range(n_tasks)]
    for t in range(n_tasks):
        images, labels = method.task_data(t, seen)
        method.begin_task(t, images, labels)
        fit_task(method, images, labels, epochs, 8)
        method.end_task(t, images, labels)
    return seen


def test_every_method_learns_and_keeps_its_buffer_within_capacity():
    for name, cls in METHODS.items():
        method, ctx = _setup(name)
        before = _params(method.net)
        _run_tasks(method, ctx)
        assert not torch.equal(before, _params(method.net)), name
        if cls.uses_buffer:
            assert 0 < len(method.buffer) <= 16, name
            assert set(method.buffer.tasks[: len(method.buffer)].tolist()) <= {0, 1}
        else:
            assert method.buffer is None


def test_reservoir_methods_store_raw_stream_images():
    method, ctx = _setup("der")
    seen = _run_tasks(method, ctx)
    stream = torch.cat([s[0] for s in seen]).flatten(1)
    stored = method.buffer.images[: len(method.buffer)].flatten(1)
    assert all((stream == row).all(1).any() for row in stored)  # unaugmented images
    assert method.buffer.logits[: len(method.buffer)].abs().sum() > 0  # DER keeps logits


def test_pbr_fills_the_buffer_at_task_end_and_distills_from_a_frozen_teacher():
    method, ctx = _setup("pbr")
    images, labels = _task(0)
    method.begin_task(0, images, labels)
    fit_task(method, images, labels, 1, 8)
    assert len(method.buffer) == 0  # nothing enters during the task
    method.end_task(0, images, labels)
    assert len(method.buffer) == 16 and method.buffer.scores[:16].max() > 0  # MI scores kept
    assert method.class_counts.tolist() == [12.0, 12.0, 0.0, 0.0]
    assert not any(p.requires_grad for p in method.teacher.parameters())
    # Right after the snapshot the student equals the teacher: both constraints are zero.
    old = method._old_classes() if method.task > 0 else torch.arange(2)
    assert torch.allclose(method.net.prototypes()[old], method.old_prototypes[old])
    t_before = _params(method.teacher)
    images1, labels1 = _task(1)
    method.begin_task(1, images1, labels1)
    fit_task(method, images1, labels1, 1, 8)
    assert torch.equal(t_before, _params(method.teacher))  # frozen
    assert not torch.allclose(method.net.prototypes()[:2], method.old_prototypes[:2])


def test_pbr_loss_terms_can_be_switched_off():
    losses = {}
    for alpha, beta in ((0.0, 0.0), (5.0, 0.0), (0.0, 5.0)):
        method, ctx = _setup("pbr")
        method.opts.alpha, method.opts.beta = alpha, beta
        images, labels = _task(0)
        method.begin_task(0, images, labels)
        fit_task(method, images, labels, 2, 8)
        method.end_task(0, images, labels)
        images1, labels1 = _task(1)
        method.begin_task(1, images1, labels1)
        losses[(alpha, beta)] = fit_task(method, images1, labels1, 2, 8)[-1].loss
    # Same seed, same data: any difference comes from the distillation terms.
    assert losses[(5.0, 0.0)] != losses[(0.0, 0.0)] and losses[(0.0, 5.0)] != losses[(0.0, 0.0)]


def test_joint_trains_once_on_everything_at_the_last_task():
    method, ctx = _setup("joint")
    seen = [_task(t) for t in range(2)]
    assert method.task_data(0, seen)[1].numel() == 0
    images, labels = method.task_data(1, seen)
    assert images.shape[0] == 48 and set(labels.tolist()) == {0, 1, 2, 3}


def test_evaluate_masks_class_il_to_seen_classes_and_task_il_to_the_task():
    method, ctx = _setup("sgd")
    tests = [_task(t, n=16, seed=100) for t in range(2)]
    c, t = evaluate(method.net, tests, ctx.task_classes, 1, ctx.preprocess, 5)
    assert c[1] == 0.0  # no class of task 1 has been seen: Class-IL cannot be right
    assert 0 <= t[1] <= 100 and len(c) == len(t) == 2
