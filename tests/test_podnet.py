"""PODNet+: POD-spatial distillation, the NCA loss (LT-CIL's call and the PODNet paper's), frozen old
proxies, LT-CIL's weight scaling."""

import math

import torch

from pbr.methods.podnet import nca_loss, pod_spatial, weight_scaling
from test_methods import _params, _setup, _task


def test_pod_spatial_on_hand_made_feature_maps():
    new = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]]])  # [B=1, C=1, H=2, W=2]
    old = torch.tensor([[[[0.0, 0.0], [0.0, 1.0]]]])
    # new: rows summed [1, 0], columns summed [1, 0] -> (1, 0, 1, 0) / sqrt 2; old: (0, 1, 0, 1) / sqrt 2.
    assert math.isclose(pod_spatial([new], [old]).item(), math.sqrt(2), rel_tol=1e-6)
    assert pod_spatial([new], [new]).item() == 0
    assert pod_spatial([new, old], [3 * new, -old]).item() < 1e-6  # squared, then normalised per sample


def test_nca_loss_of_the_podnet_paper_hand_computation():
    sims = torch.tensor([[0.9, 0.1, 0.0]])
    # z = (0.9 - 0.6, 0.1, 0.0); -log(e^0.3 / (e^0.1 + e^0)) = log(e^0.1 + 1) - 0.3
    loss = nca_loss(sims, torch.tensor([0]), 1.0, 0.6, "podnet_paper")
    assert math.isclose(loss.item(), math.log(math.exp(0.1) + 1) - 0.3, rel_tol=1e-6)
    assert nca_loss(torch.tensor([[0.9, -0.9, -0.9]]), torch.tensor([0]), 10.0, 0.1, "podnet_paper").item() == 0


def test_nca_loss_as_lt_cil_calls_it_is_cross_entropy_on_scaled_similarities():
    """LT-CIL's nca(outputs, targets): margin 0.6 taken off every class, the positive in the
    denominator, no hinge. Two samples, eta 2, by hand."""
    sims = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.5, -0.5]])
    y = torch.tensor([0, 1])
    # -log(e^1.8 / (e^1.8 + e^0.2 + e^0)) and -log(e^1.0 / (e^0.4 + e^1.0 + e^-1.0))
    first = math.log(math.exp(1.8) + math.exp(0.2) + 1) - 1.8
    second = math.log(math.exp(0.4) + math.exp(1.0) + math.exp(-1.0)) - 1.0
    for margin in (0.6, 0.0, 5.0):  # the margin shifts every class alike: it cancels
        assert math.isclose(nca_loss(sims, y, 2.0, margin).item(), (first + second) / 2, rel_tol=1e-6)
    # Not hinged: a right answer the paper's loss leaves at 0 still has log(1 + 2 e^-1.8) here.
    right = torch.tensor([[0.9, -0.9, -0.9]])
    assert nca_loss(right, torch.tensor([0]), 1.0, 0.1, "podnet_paper").item() == 0
    assert math.isclose(nca_loss(right, torch.tensor([0]), 1.0, 0.1).item(), math.log(1 + 2 * math.exp(-1.8)),
                        rel_tol=1e-6)


def test_podnet_defaults_follow_lt_cil_and_the_margin_is_read_only_by_the_papers_loss():
    from pbr.methods import METHODS

    cls = METHODS["podnet"]
    opts, _ = cls.options("cifar100", 500)
    assert (opts.nca, opts.lws_lr_factor) == ("ltcil", 10.0)  # its call of nca(); its --lr-factor
    assert not cls.reads("nca_margin", {"nca": "ltcil"}) and cls.reads("nca_margin", {"nca": "podnet_paper"})
    assert cls.reads("nca_scale", {"nca": "ltcil"})


def test_weight_scaling_lifts_a_tail_class_that_the_head_class_swallows():
    """60 head samples, well placed; 4 tail samples scored closer to the head class. Drawn
    class-balanced, the tail's scale rises against the head's until the tail is predicted."""
    sims = torch.cat([torch.tensor([[0.9, 0.1]]).repeat(60, 1), torch.tensor([[0.5, 0.4]]).repeat(4, 1)])
    labels = torch.tensor([0] * 60 + [1] * 4)
    g = torch.Generator().manual_seed(0)
    w = weight_scaling(sims, labels, torch.tensor([0, 1]), torch.ones(3), 10.0, 30, 0.5, 16, g)
    assert w[2] == 1  # a class not yet seen keeps its scale
    assert w[1] > w[0]
    assert ((sims * w[:2]).argmax(1) == labels).all()


def _stage_two_of_task_zero(**opts):
    torch.manual_seed(0)  # the LSC's proxies
    method, ctx = _setup("podnet", n_classes=4, n_tasks=2, buffer_size=8, lws_epochs=1, lr=10.0, **opts)
    ctx.replay_batch_size = 64  # 24 samples: one draw, one SGD step of the scales
    images, labels = _task(0)
    method.begin_task(0, images, labels)
    method.end_task(0, images, labels)
    return method.scales


def test_weight_scaling_trains_at_lr_over_the_lr_factor():
    """One plain SGD step from 1: the scales' change is lr / lws_lr_factor times the same gradient."""
    full, tenth = _stage_two_of_task_zero(lws_lr_factor=1.0), _stage_two_of_task_zero()
    assert (full[:2] - 1).abs().min() > 1e-2
    assert torch.allclose(tenth[:2] - 1, (full[:2] - 1) / 10, rtol=1e-4)
    assert torch.equal(full[2:], torch.ones(2)) and torch.equal(tenth[2:], torch.ones(2))


def test_stage_two_moves_only_the_scales_and_old_proxies_stay():
    method, ctx = _setup("podnet", n_classes=4, n_tasks=2, buffer_size=8)
    images, labels = _task(0)
    method.begin_task(0, images, labels)
    method.begin_epoch(0)
    for i in range(0, 24, 8):
        method.observe(ctx.augment(images[i:i + 8], ctx.generator), labels[i:i + 8], images[i:i + 8])
    net, lsc, scales = _params(method.net), _params(method.lsc), method.scales.clone()
    method.end_task(0, images, labels)  # the memory, then the scaling stage
    assert torch.equal(net, _params(method.net)) and torch.equal(lsc, _params(method.lsc))
    assert not torch.equal(scales, method.scales) and torch.equal(scales[2:], method.scales[2:])

    k = method.opts.proxies
    before = method.lsc.weight.detach().clone()
    images, labels = _task(1)
    method.begin_task(1, images, labels)
    method.begin_epoch(0)
    method.observe(ctx.augment(images[:8], ctx.generator), labels[:8], images[:8])
    assert torch.equal(method.lsc.weight[: 2 * k], before[: 2 * k])  # task 0's proxies frozen
    assert not torch.equal(method.lsc.weight[2 * k:], before[2 * k:])  # task 1's learn
    after_task0 = method.scales.clone()
    method.end_task(1, images, labels)
    # As LT-CIL's code: every task's scales are trained again, from where they were.
    assert (method.scales - after_task0).abs().min() > 0
