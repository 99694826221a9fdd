import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pbr.models import Net, ResNet18


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("side", [32, 64])
def test_resnet18_feature_shape(side):
    net = ResNet18(width=4)
    x = torch.randn(2, 3, side, side, generator=_gen())
    f = net(x)
    assert net.feature_dim == 32
    assert f.shape == (2, 32)


def test_resnet18_is_mammoth_cifar_variant():
    net = ResNet18(width=64)
    # CIFAR stem: 3x3, stride 1, no max-pool anywhere.
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1) and net.conv1.padding == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in net.modules())
    assert isinstance(net.layer1[0].shortcut, nn.Identity)
    for layer, width in ((net.layer2, 128), (net.layer3, 256), (net.layer4, 512)):
        conv = layer[0].shortcut[0]
        assert conv.kernel_size == (1, 1) and conv.stride == (2, 2) and conv.out_channels == width
    # torchvision's resnet18 trunk (11,176,512) minus the 7x7->3x3 stem difference (7,680).
    assert sum(p.numel() for p in net.parameters()) == 11_168_832


def test_cosine_head_formula():
    net = Net(5, width=4, scale=10.0, dropout=0.5).eval()
    f = torch.randn(3, 32, generator=_gen(1))
    w = net.head.weight
    expected = 10.0 * F.normalize(f, dim=1) @ F.normalize(w, dim=1).T
    torch.testing.assert_close(net.classify(f), expected)
    assert net.classify(f).abs().max() <= 10.0 + 1e-5
    assert not hasattr(net.head, "bias")
    # Another scale: a feature along class 2's vector has cosine 1 there, so its logit is the scale.
    net = Net(5, width=4, scale=3.0, dropout=0.0).eval()
    logits = net.classify(7.0 * net.head.weight[2:3].detach())
    assert logits[0, 2].item() == pytest.approx(3.0) and logits.abs().max() <= 3.0 + 1e-5


def test_linear_head_formula():
    net = Net(5, width=4, head="linear", dropout=0.5).eval()
    f = torch.randn(3, 32, generator=_gen(2))
    torch.testing.assert_close(net.classify(f), f @ net.head.weight.T + net.head.bias)
    torch.testing.assert_close(net.prototypes(), net.head.weight)


def test_dropout_only_in_training_or_mc():
    net = Net(5, width=4, dropout=0.5)
    f = torch.randn(4, 32, generator=_gen(3))
    net.train()
    assert not torch.equal(net.classify(f), net.classify(f))
    net.eval()
    assert torch.equal(net.classify(f), net.classify(f))
    assert not torch.equal(net.classify(f, mc=True), net.classify(f))


def test_dropout_acts_on_the_normalised_feature_so_the_mean_pass_is_the_eval_logit():
    """The cosine head drops entries of f / |f| (scaled by 1 / (1 - p)), as the MC scorer
    (pbr.uncertainty.mc_probs) does, so the mean of many dropout passes is the eval logit. A feature
    along class 0's vector: eval logit 10; dropping before normalising would give about
    10 * sqrt(1 - p) = 7.1 at p = 0.5."""
    net = Net(3, width=4, scale=10.0, dropout=0.5)
    f = net.head.weight[:1].detach().expand(4000, -1)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        passes = net.classify(f, mc=True)[:, 0]
    assert net.eval().classify(f[:1])[0, 0].item() == pytest.approx(10.0)
    assert abs(passes.mean().item() - 10.0) < 0.3  # per-pass sd about 2.6: the mean's about 0.04


def test_initialisation_is_pytorchs_default_for_linear_and_conv_layers():
    """reset_linear_ from a generator seeded 0 draws what nn.Linear / nn.Conv2d draw by default after
    torch.manual_seed(0): the same bounds (kaiming_uniform_ at a = sqrt(5), bias within 1 / sqrt(fan_in))."""
    from pbr.models.heads import reset_linear_

    with torch.random.fork_rng():
        torch.manual_seed(0)
        linear, conv = nn.Linear(32, 5), nn.Conv2d(3, 4, 3)
    g = _gen(0)
    for ref in (linear, conv):
        w, b = torch.empty_like(ref.weight), torch.empty_like(ref.bias)
        reset_linear_(w, b, g)
        assert torch.equal(w, ref.weight) and torch.equal(b, ref.bias)


def test_forward_is_classify_of_features_and_backprops():
    net = Net(3, width=4).eval()
    x = torch.randn(2, 3, 32, 32, generator=_gen(4))
    torch.testing.assert_close(net(x), net.classify(net.features(x)))
    net.train()
    net(x).sum().backward()
    assert net.backbone.conv1.weight.grad is not None and net.head.weight.grad is not None


def test_prototypes_and_weight_norms():
    net = Net(6, width=4)
    with torch.no_grad():
        net.head.weight.mul_(torch.arange(1, 7, dtype=torch.float32).unsqueeze(1))
    assert net.prototypes().shape == (6, 32)
    torch.testing.assert_close(net.prototypes().norm(dim=1), torch.ones(6))
    torch.testing.assert_close(net.weight_norms(), net.head.weight.norm(dim=1))


def test_generator_init_is_reproducible():
    a, b, c = Net(4, width=4, generator=_gen(7)), Net(4, width=4, generator=_gen(7)), Net(4, width=4, generator=_gen(8))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["head.weight"], sc["head.weight"])
    assert not torch.equal(sa["backbone.conv1.weight"], sc["backbone.conv1.weight"])


@pytest.mark.parametrize("kwargs", [{"head": "mlp"}, {"dropout": 1.0}, {"dropout": -0.1}, {"scale": 0.0}, {"width": 0}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        Net(4, **{"width": 4, **kwargs})


@pytest.mark.parametrize("head", ["cosine", "linear"])
def test_the_classifier_keeps_fp32_under_bf16_autocast(head):
    """At the paper's logit scale (s / tau1 = 100) bf16 logits would be off by up to about 0.7 (one
    unit of bf16's last place near 100 is 0.5); the head runs in fp32, so only the bf16 features
    differ: the logits stay within a few hundredths of fp32's."""
    net = Net(10, 8, head, 10.0, 0.0, generator=torch.Generator().manual_seed(0)).eval()
    x = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        f = net.features(x)
        # Class vectors close to ten samples' features: cosines near 0.95, as in a trained head.
        noise = torch.randn(10, f.shape[1], generator=torch.Generator().manual_seed(2))
        net.head.weight.copy_(f[:10] + 0.3 * f[:10].norm(dim=1, keepdim=True) * noise / f.shape[1] ** 0.5)
        ref = net(x) / 0.1
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = net(x)
            feats = net.features(x)
        assert feats.dtype == torch.bfloat16 and got.dtype == torch.float32  # the backbone in bf16, not the head
        assert torch.equal(got, net.classify(feats.float()))  # exactly the fp32 head on the bf16 features
        if head == "cosine":
            assert (ref / 100).max() > 0.9
            assert (got / 0.1 - ref).abs().max() < 0.1
