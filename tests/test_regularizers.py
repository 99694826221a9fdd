"""oEWC, SI and LwF: each one's defining mechanism on hand-made numbers."""

import math

import pytest
import torch

from pbr.methods.ewc import empirical_fisher
from pbr.methods.lwf import sharpened_log_softmax
from test_methods import _run_tasks, _setup, _task


def test_fisher_is_the_true_labels_probability_times_its_squared_log_likelihood_gradient():
    """A linear softmax model has d log p_y / d W_c = (1[c = y] - p_c) x: the Fisher by hand."""
    net = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, -1.0], [0.5, 2.0]]))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 1])
    expect = torch.zeros(2, 2)
    for xi, yi in zip(x.tolist(), y.tolist()):
        z = [net.weight[c, 0].item() * xi[0] + net.weight[c, 1].item() * xi[1] for c in range(2)]
        p = [math.exp(v) / sum(math.exp(u) for u in z) for v in z]
        for c in range(2):
            for j in range(2):
                expect[c, j] += p[yi] * (((c == yi) - p[c]) * xi[j]) ** 2
    fisher = empirical_fisher(net, x, y, chunk=2)  # two chunks: 2 + 1 samples
    torch.testing.assert_close(fisher["weight"], expect / 3)


def test_online_ewc_penalises_moving_away_from_the_last_tasks_weights_by_the_decayed_fisher():
    method, ctx = _setup("ewc_on", e_lambda=2.0, gamma=0.5)
    assert method.penalty() is None  # nothing to protect during the first task
    _run_tasks(method, ctx, n_tasks=1)
    first = {n: f.clone() for n, f in method.fisher.items()}
    assert method.penalty().item() == 0.0  # at the anchor
    with torch.no_grad():
        method.net.head.weight.add_(0.1)
    expect = 2.0 * (first["head.weight"] * 0.1 ** 2).sum()
    torch.testing.assert_close(method.penalty(), expect)
    images, labels = _task(1)
    method.ctx.augment = lambda x, g: ctx.preprocess(x)  # no random crop: the new Fisher can be recomputed
    new = empirical_fisher(method.net, ctx.preprocess(images), labels)
    method.end_task(1, images, labels)
    for n, f in method.fisher.items():  # gamma * old + new
        torch.testing.assert_close(f, 0.5 * first[n] + new[n])


def test_si_path_integral_and_importance_by_hand():
    """lr 0.1; gradients 3 (clipped to 1) then 0.5 on one weight: omega = 0.1 * (1 + 0.25) = 0.125;
    the weight moves 2 -> 1.9 -> 1.85, so Omega = 0.125 / (0.15^2 + xi) with xi = 1."""
    method, _ = _setup("si", lr=0.1, c=0.5, xi=1.0)
    net = method.net
    p = net.head.weight
    with torch.no_grad():
        for q in net.parameters():
            q.zero_()
        p[0, 0] = 2.0
    method.anchor = {n: q.detach().clone() for n, q in net.named_parameters()}
    method.opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for g in (3.0, 0.5):
        for q in net.parameters():
            q.grad = torch.zeros_like(q)
        p.grad[0, 0] = g
        method.after_backward()
        method.opt.step()
        method.after_step()
    assert p[0, 0].item() == pytest.approx(1.85)
    assert method.small_omega["head.weight"][0, 0].item() == pytest.approx(0.125)
    method.end_task(0, torch.zeros(0, 3, 32, 32, dtype=torch.uint8), torch.zeros(0, dtype=torch.int64))
    big = 0.125 / (0.15 ** 2 + 1.0)
    assert method.big_omega["head.weight"][0, 0].item() == pytest.approx(big)
    assert method.small_omega["head.weight"].abs().sum().item() == 0.0  # reset for the next task
    with torch.no_grad():
        p[0, 0] = 1.95
    assert method.penalty().item() == pytest.approx(0.5 * big * 0.1 ** 2)


def test_lwf_sharpens_the_old_classes_softmax_and_distils_it():
    """Mammoth's smooth(p, 2): sqrt(p) renormalised; [0.8, 0.2] -> [2/3, 1/3]."""
    logits = torch.log(torch.tensor([[0.8, 0.2]])) + 3.0  # any shift: the softmax is [0.8, 0.2]
    torch.testing.assert_close(sharpened_log_softmax(logits, 2.0).exp(), torch.tensor([[2 / 3, 1 / 3]]))
    # Finite where a probability underflows (p ** 0.5 has an infinite slope at 0).
    z = torch.tensor([[0.0, -200.0]], requires_grad=True)
    sharpened_log_softmax(z, 2.0)[0, 0].backward()
    assert torch.isfinite(z.grad).all()
    method, ctx = _setup("lwf", alpha=1.0, warmup_epochs=2)
    _run_tasks(method, ctx, n_tasks=1)
    assert method.teacher is None
    images, labels = _task(1)
    head_before = method.net.head.weight.detach().clone()
    body_before = [q.detach().clone() for q in method.net.backbone.parameters()]
    method.begin_task(1, images, labels)
    # The warm-up trains the new classes' head rows only; the backbone is frozen for it.
    assert all(torch.equal(a, b) for a, b in zip(body_before, method.net.backbone.parameters()))
    moved = (method.net.head.weight.detach() - head_before).abs().sum(1)
    assert moved[2:].sum() > 0 and moved[:2].sum() == 0
    # The teacher is the warmed-up network, frozen in eval mode (BatchNorm's running statistics).
    x = ctx.augment(images[:8], torch.Generator().manual_seed(0))
    method.net.eval()
    with torch.no_grad():
        torch.testing.assert_close(method.teacher(x), method.net(x))
        p_old = sharpened_log_softmax(method.teacher(x)[:, :2], 2.0).exp()
    method.net.train()
    with torch.no_grad():
        out = method.net(x)
        p_new = sharpened_log_softmax(out[:, :2], 2.0).exp()
        ce = torch.nn.functional.cross_entropy(out[:, :4], labels[:8])  # over the 4 classes seen
    loss = method.observe(x, labels[:8], images[:8])
    assert loss.item() == pytest.approx(ce.item() - (p_old * p_new.log()).sum(1).mean().item(), rel=1e-4)
