"""PODNet+: POD-spatial distillation, the NCA loss, frozen old proxies, LT-CIL's weight scaling."""

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


def test_nca_loss_hand_computation():
    sims = torch.tensor([[0.9, 0.1, 0.0]])
    # z = (0.9 - 0.6, 0.1, 0.0); -log(e^0.3 / (e^0.1 + e^0)) = log(e^0.1 + 1) - 0.3
    loss = nca_loss(sims, torch.tensor([0]), 1.0, 0.6)
    assert math.isclose(loss.item(), math.log(math.exp(0.1) + 1) - 0.3, rel_tol=1e-6)
    assert nca_loss(torch.tensor([[0.9, -0.9, -0.9]]), torch.tensor([0]), 10.0, 0.1).item() == 0  # hinged


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
