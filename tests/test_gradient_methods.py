"""GEM's QP projection, A-GEM's projection, both methods' steps and memories, and GSS's rules."""

import pytest
import torch

from pbr.methods.agem import agem_project
from pbr.methods.gem import flat_grad, gem_project
from test_methods import _params, _run_tasks, _setup, _task


def test_gem_projection_on_hand_made_gradients():
    # z_2 >= 0 is violated by g = (1, -2): the closest gradient obeying it is (1, 0).
    z = gem_project(torch.tensor([1.0, -2.0]), torch.tensor([[0.0, 1.0]]), eps=0.0)
    assert torch.allclose(z, torch.tensor([1.0, 0.0]), atol=1e-9)
    # Both coordinates constrained, g in the opposite quadrant: the closest is the origin.
    z = gem_project(torch.tensor([-1.0, -3.0]), torch.eye(2), eps=0.0)
    assert torch.allclose(z, torch.zeros(2), atol=1e-9)
    # One constraint met already (g . (1, 0) = 2 > 0), one violated: only the latter moves g.
    z = gem_project(torch.tensor([2.0, -1.0]), torch.eye(2), eps=0.0)
    assert torch.allclose(z, torch.tensor([2.0, 0.0]), atol=1e-9)


def test_gem_projection_is_the_closest_gradient_meeting_every_constraint():
    """Random 50-d gradient against 4 old tasks' gradients: the KKT conditions of
    min ||z - g||^2 s.t. G z >= 0, i.e. z - g = G^T v with v >= 0, G z >= 0, v_i (G z)_i = 0."""
    torch.manual_seed(0)
    G = torch.randn(4, 50, dtype=torch.float64)
    g = -G.sum(0) + 0.1 * torch.randn(50, dtype=torch.float64)  # against every old task
    z = gem_project(g, G, margin=0.0, eps=1e-9)
    Gz = G @ z
    assert (Gz >= -1e-6).all()
    v = torch.linalg.lstsq(G.T, z - g).solution
    assert torch.allclose(G.T @ v, z - g, atol=1e-6)  # the change lies in the span of G's rows
    assert (v >= -1e-6).all()
    assert (v * Gz).abs().max() < 1e-5
    assert ((z - g).norm() < (torch.zeros(50, dtype=torch.float64) - g).norm())  # closer than z = 0, also feasible


def test_gem_margin_pushes_the_gradient_inside_the_cone():
    G = torch.tensor([[0.0, 1.0]])
    # g . e2 = -0.2: the exact projection adds v = 0.2 e2; the margin makes v at least 0.5.
    z = gem_project(torch.tensor([1.0, -0.2]), G, margin=0.5, eps=0.0)
    assert torch.allclose(z, torch.tensor([1.0, 0.3]), atol=1e-9)
    # A larger violation needs more than the margin: v = 2, z = (1, 0) as with margin 0.
    z = gem_project(torch.tensor([1.0, -2.0]), G, margin=0.5, eps=0.0)
    assert torch.allclose(z, torch.tensor([1.0, 0.0]), atol=1e-9)


def test_agem_projection_formula():
    g, ref = torch.tensor([1.0, -2.0, 0.0]), torch.tensor([0.0, 2.0, 0.0])
    # g . ref = -4 < 0: g - (-4 / 4) ref = (1, 0, 0), orthogonal to ref.
    assert torch.allclose(agem_project(g, ref), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(agem_project(torch.tensor([1.0, 2.0, 0.0]), ref), torch.tensor([1.0, 2.0, 0.0]))


@pytest.mark.parametrize("name", ["gem", "agem"])
def test_memory_holds_equal_shares_per_task(name):
    method, ctx = _setup(name, n_classes=6, n_tasks=3, buffer_size=9)
    _run_tasks(method, ctx, n_tasks=3)
    assert torch.bincount(method.buffer.tasks[: len(method.buffer)]).tolist() == [3, 3, 3]


def test_gem_memory_one_batch_per_task_whatever_the_capacity_as_mammoth():
    """Mammoth's gem @5bb9275 stores one loader batch per task (8 samples here, the replay batch)
    through its reservoir; the default splits the capacity: 40 // 3 = 13 per task."""
    counts = {}
    for memory in ("one_batch", "per_task"):
        method, ctx = _setup("gem", n_classes=6, n_tasks=3, buffer_size=40, gem_memory=memory)
        seen = _run_tasks(method, ctx, n_tasks=3)
        n = len(method.buffer)
        tasks, labels = method.buffer.tasks[:n], method.buffer.labels[:n]
        counts[memory] = torch.bincount(tasks).tolist()
        assert torch.equal(labels // 2, tasks)  # each task's slots hold its own classes
        for t, (images, _) in enumerate(seen):  # distinct samples of that task
            stored = method.buffer.images[:n][tasks == t]
            assert all(any(torch.equal(s, im) for im in images) for s in stored)
            assert torch.unique(stored.flatten(1), dim=0).shape[0] == stored.shape[0]
    assert counts == {"one_batch": [8, 8, 8], "per_task": [13, 13, 13]}


def test_gem_step_never_raises_an_old_tasks_memory_loss_to_first_order():
    """After task 0, each step's update lr * z (plain SGD) has z . g_old >= 0 for the old task's
    memory gradient; where the new task's gradient pointed against it, the constraint is active."""
    method, ctx = _setup("gem", n_classes=4, n_tasks=2, buffer_size=8, margin=0.0)
    _run_tasks(method, ctx, n_tasks=1)
    images, labels = _task(1)
    method.begin_task(1, images, labels)
    method.begin_epoch(0)
    cosines = []
    for i in range(0, 24, 8):
        raw, y = images[i:i + 8], labels[i:i + 8]
        before = _params(method.net)
        method.observe(ctx.augment(raw, ctx.generator), y, raw)
        step = before - _params(method.net)
        cosines += (method.memory_grads @ step / (method.memory_grads.norm(dim=1) * step.norm())).tolist()
    assert min(cosines) > -1e-4
    assert min(abs(c) for c in cosines) < 1e-4  # a projected step lies on the constraint's boundary


def test_agem_r_fills_its_reservoir_online_and_agem_at_task_end():
    r, ctx = _setup("agem_r", buffer_size=8)
    a, _ = _setup("agem", buffer_size=8)
    for m in (r, a):
        images, labels = _task(0)
        m.begin_task(0, images, labels)
        m.begin_epoch(0)
        m.observe(ctx.augment(images[:8], ctx.generator), labels[:8], images[:8])
    assert len(r.buffer) == 8 and len(a.buffer) == 0
    assert flat_grad(r.params).abs().sum() > 0


def test_gss_score_is_one_plus_the_largest_cosine():
    from pbr.memory.gss import scores

    new = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    stored = torch.tensor([[-1.0, 0.0], [-1.0, -1.0]])
    # Sample 0: cosines -1 and -0.707; sample 1: 0 and -0.707.
    assert torch.allclose(scores(new, stored), torch.tensor([1 - 0.5 ** 0.5, 1.0]), atol=1e-6)


def _gss(capacity, **opts):
    from pbr.buffer import Buffer
    from pbr.memory.gss import GradientDiversity

    return GradientDiversity(Buffer(capacity, (3, 1, 1), n_classes=2), torch.Generator(), **opts)


def test_gss_replacement_lottery_on_hand_made_scores():
    policy = _gss(2)
    held = [1.5, 0.5]
    assert policy.place(held, 1.2, [0.0, 0.0]) == 2  # c >= 1: not stored
    # r = 0.5 * 2.0 = 1.0 falls in slot 0's mass (1.5); kept as 0.4 < 1.5 / (1.5 + 0.2).
    assert policy.place(held, 0.2, [0.5, 0.4]) == 0 and held == [0.2, 0.5]
    # r = 0.9 * 0.7 = 0.63 falls in slot 1's; 0.5 / (0.5 + 0.2) = 0.714 < 0.8: not stored.
    assert policy.place(held, 0.2, [0.9, 0.8]) == 2 and held == [0.2, 0.5]


def test_gss_mammoth_rule_gates_on_the_batch_score_on_hand_made_scores():
    """Mammoth's rule: a batch scoring >= 1 stores nothing, even a sample of its own score 0.2; a
    batch scoring < 1 lets a sample of score 1.5 into the lottery (the paper's rule never would)."""
    policy = _gss(2, rule="mammoth")
    held = [0.5, 0.5]
    assert policy.place(held, 0.2, [0.0, 0.0], batch_c=1.2) == 2 and held == [0.5, 0.5]
    # r = 0.1 * 1.0 falls in slot 0's mass; kept as 0.1 < 0.5 / (0.5 + 1.5) = 0.25.
    assert policy.place(held, 1.5, [0.1, 0.1], batch_c=0.8) == 0 and held == [1.5, 0.5]
    assert policy.place([0.5, 0.5], 1.5, [0.1, 0.1]) == 2  # the paper's rule: c >= 1 never stored
    filling = [0.5]
    assert policy.place(filling, 0.2, [0.0, 0.0], batch_c=0.7) == 1 and filling == [0.5, 0.7]  # the batch's score


def test_gss_scores_stored_while_filling_are_the_batch_score_under_mammoths_rule():
    from pbr.memory.gss import per_sample_grads, scores

    kept = {}
    for rule in ("paper", "mammoth"):
        method, ctx = _setup("gss", buffer_size=8, gss_rule=rule, gss_subset=8)
        images, labels = _task(0, n=8)
        method.begin_task(0, images, labels)
        method.begin_epoch(0)
        method.policy.offer(images[:4], labels[:4], torch.zeros(4, dtype=torch.int64))
        method.policy.offer(images[4:], labels[4:], torch.zeros(4, dtype=torch.int64))  # compared with all 4 stored (the subset holds them all)
        kept[rule] = method.buffer.scores[4:8]
        new = per_sample_grads(method.net, ctx.preprocess(images[4:]), labels[4:])
        old = per_sample_grads(method.net, ctx.preprocess(images[:4]), labels[:4])
        own, batch = scores(new, old), scores(new.mean(0, keepdim=True), old)
    assert torch.allclose(kept["paper"], own, atol=1e-6) and own.max() - own.min() > 1e-4  # each sample its own
    assert torch.allclose(kept["mammoth"], batch.expand(4), atol=1e-6)  # all the batch's
    assert (own - batch).abs().min() > 1e-5


def test_gss_per_sample_gradients_match_one_backward_per_sample():
    from pbr.memory.gss import per_sample_grads

    method, ctx = _setup("gss")
    net = method.net
    x, y = ctx.preprocess(_task(0, n=5)[0]), _task(0, n=5)[1]
    got = per_sample_grads(net, x, y, chunk=2)
    net.eval()
    for i in range(5):
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x[i:i + 1]), y[i:i + 1]).backward()
        assert torch.allclose(got[i], flat_grad(list(net.parameters())), atol=1e-5)
    assert net.training is False  # per_sample_grads restores the mode it found (eval here)


def test_gss_rejects_copies_of_what_it_holds_once_full():
    """A sample identical to the stored ones has cosine 1 with them, score 2 >= 1: never stored."""
    method, ctx = _setup("gss", buffer_size=4)
    images, labels = _task(0, n=4)
    method.begin_task(0, images, labels)
    method.begin_epoch(0)
    method.policy.offer(images, labels, torch.zeros(4, dtype=torch.int64))  # fills the memory
    assert len(method.buffer) == 4 and method.buffer.scores[:4].tolist() == pytest.approx([0.1] * 4)
    before = method.buffer.images.clone()
    method.policy.offer(images, labels, torch.zeros(4, dtype=torch.int64))
    assert torch.equal(method.buffer.images, before) and method.policy.seen == 8
