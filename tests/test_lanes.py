"""Lanes (pbr.lanes): L runs trained as one stacked network must be the L separate runs.

The references are separate networks trained with the project's own plain step (the sgd method's
observe: cross-entropy, torch.optim.SGD, fresh per task). Multi-step comparisons run in float64:
at width 4 a float32 run amplifies the last-bit differences of grouped against single
convolutions within a few steps (BatchNorm over near-constant channels), which would hide a real
fault behind a loose tolerance; float32 is compared over one step. Images are 8x8 (the CIFAR
stem takes any size) to keep the file at a few seconds.
"""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pbr.lanes import Lanes, sgd, step
from pbr.methods import Context, create
from pbr.models import Net

L, WIDTH, B, SIDE, CLASSES = 3, 4, 6, 8, 10
F32 = {"rtol": 1e-4, "atol": 1e-5}  # one float32 step: sums over the batch in another order


def _nets(dtype=torch.float32, head="linear"):
    return [Net(CLASSES, WIDTH, head, dropout=0.0, generator=torch.Generator().manual_seed(s)).to(dtype)
            for s in range(L)]


def _batches(k, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(L, B, 3, SIDE, SIDE, generator=g, dtype=dtype),
             torch.randint(0, CLASSES, (L, B), generator=g)) for _ in range(k)]


def _sgd_method(net, lr):
    """The project's sgd method on `net`, in its first task (begin_task makes its SGD)."""
    ctx = Context(CLASSES, [torch.arange(CLASSES)], torch.device("cpu"), lambda x, g: x, lambda x: x,
                  torch.Generator().manual_seed(0))
    m = create("sgd", net, ctx, lr=lr)
    m.begin_task(0, torch.zeros(1, 3, SIDE, SIDE, dtype=torch.uint8), torch.zeros(1, dtype=torch.long))
    return m


def _assert_lane_is(lanes, i, net, **tol):
    got = lanes.lane_state_dict(i)
    want = net.state_dict()
    assert list(got) == list(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], **tol, msg=lambda m: f"lane {i} {name}: {m}")


@pytest.mark.parametrize("dtype,k,tol", [(torch.float64, 4, {"rtol": 1e-10, "atol": 1e-10}),
                                         (torch.float32, 1, F32)])
def test_lanes_train_as_the_separate_runs(dtype, k, tol):
    nets = _nets(dtype)
    lanes = Lanes(nets)
    opt = sgd(lanes, lr=0.1)
    refs = [_sgd_method(copy.deepcopy(n), lr=0.1) for n in nets]
    start = nets[0].backbone.bn1.running_mean.clone()
    for x, y in _batches(k, dtype):
        losses = step(lanes, opt, x, y)
        want = torch.stack([m.observe(x[i], y[i], None) for i, m in enumerate(refs)])
        torch.testing.assert_close(losses, want.to(losses.dtype), **tol)
    for i, m in enumerate(refs):
        _assert_lane_is(lanes, i, m.net, **tol)
    # Not vacuous: the BatchNorm statistics moved, per lane, and counted every step.
    sd = lanes.lane_state_dict(0)
    assert not torch.allclose(sd["backbone.bn1.running_mean"], start)
    assert int(sd["backbone.layer4.1.bn2.num_batches_tracked"]) == k
    assert not torch.allclose(sd["backbone.bn1.running_mean"], lanes.lane_state_dict(1)["backbone.bn1.running_mean"])


def test_weight_decay_and_the_cosine_head_per_lane():
    nets = _nets(torch.float64, head="cosine")
    lanes = Lanes(nets)
    opt = sgd(lanes, lr=0.05, weight_decay=5e-3)
    refs = [copy.deepcopy(n) for n in nets]
    opts = [torch.optim.SGD(r.parameters(), lr=0.05, weight_decay=5e-3) for r in refs]
    for x, y in _batches(3, torch.float64):
        step(lanes, opt, x, y)
        for i, (r, o) in enumerate(zip(refs, opts)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(r(x[i]), y[i]).backward()
            o.step()
    for i, r in enumerate(refs):
        _assert_lane_is(lanes, i, r, rtol=1e-10, atol=1e-10)


def test_a_lane_unstacks_into_a_net_that_predicts_the_same():
    lanes = Lanes(_nets())
    opt = sgd(lanes, lr=0.1)
    for x, y in _batches(2):
        step(lanes, opt, x, y)
    lanes.eval()
    x = torch.randn(L, 5, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        laned = lanes(x)
    for i in range(L):
        net = Net(CLASSES, WIDTH, "linear", dropout=0.0)
        net.load_state_dict(lanes.lane_state_dict(i))  # strict: every key, every shape
        with torch.no_grad():
            torch.testing.assert_close(net.eval()(x[i]), laned[i], **F32)


def test_lanes_do_not_share_gradients_or_statistics():
    """Changing lane 0's batch changes lane 0 only: lanes 1 and 2 stay bit for bit."""
    nets = _nets()
    runs = []
    for perturb in (False, True):
        lanes = Lanes(nets)
        opt = sgd(lanes, lr=0.1)
        for x, y in _batches(2):
            if perturb:
                x, y = x.clone(), y.clone()
                x[0] = x[0] * 3 + 1
                y[0] = (y[0] + 1) % CLASSES
            step(lanes, opt, x, y)
        runs.append([lanes.lane_state_dict(i) for i in range(L)])
    same, changed = runs
    for i in (1, 2):
        for name, t in same[i].items():
            assert torch.equal(t, changed[i][name]), f"lane {i} {name} moved when only lane 0's batch changed"
    assert not torch.equal(same[0]["backbone.conv1.weight"], changed[0]["backbone.conv1.weight"])
    assert not torch.equal(same[0]["backbone.bn1.running_var"], changed[0]["backbone.bn1.running_var"])


def test_lanes_resume_from_saved_single_run_states(tmp_path):
    """Saving each lane as a single run's state_dict and resuming gives the uninterrupted run."""
    batches = _batches(4)
    lanes = Lanes(_nets())
    opt = sgd(lanes, lr=0.1)
    for x, y in batches:
        step(lanes, opt, x, y)
    straight = [lanes.lane_state_dict(i) for i in range(L)]

    lanes = Lanes(_nets())
    opt = sgd(lanes, lr=0.1)
    for x, y in batches[:2]:
        step(lanes, opt, x, y)
    for i in range(L):
        torch.save(lanes.lane_state_dict(i), tmp_path / f"lane{i}.pt")
    # Resume two ways: stacking networks loaded from the files, and loading into a fresh lane set.
    loaded = []
    for i in range(L):
        net = Net(CLASSES, WIDTH, "linear", dropout=0.0)
        net.load_state_dict(torch.load(tmp_path / f"lane{i}.pt"))
        loaded.append(net)
    fresh = Lanes(_nets())
    for i in reversed(range(L)):
        fresh.load_lane_state_dict(i, torch.load(tmp_path / f"lane{i}.pt"))
    for resumed in (Lanes(loaded), fresh):
        opt = sgd(resumed, lr=0.1)
        for x, y in batches[2:]:
            step(resumed, opt, x, y)
        for i in range(L):
            for name, t in straight[i].items():
                assert torch.equal(resumed.lane_state_dict(i)[name], t), f"lane {i} {name} differs after resume"


class _ConvInputs(TorchDispatchMode):
    """Records the dtype and layout the convolution kernels receive (below vmap and autocast)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            self.seen.append((args[0].dtype, args[0].is_contiguous(memory_format=torch.channels_last),
                              args[1].dtype))
        return func(*args, **(kwargs or {}))


def test_bf16_lanes_run_the_convolutions_in_bf16_and_keep_fp32_state():
    nets = _nets()
    x, y = _batches(1)[0]
    spy = _ConvInputs()
    with spy, torch.autocast("cpu", dtype=torch.bfloat16):  # what autocast alone does under vmap
        Lanes(nets).losses(x, y)
    assert {s[0] for s in spy.seen} == {torch.float32}
    lanes = Lanes(nets, compute_dtype=torch.bfloat16)
    spy = _ConvInputs()
    with spy:
        got = step(lanes, sgd(lanes, lr=0.1), x, y)
    assert spy.seen and {(s[0], s[2]) for s in spy.seen} == {(torch.bfloat16, torch.bfloat16)}
    # The classifier stays fp32, as a single run's head under bf16 autocast (pbr.models.heads): its
    # parameters are not cast, so the logits arrive in fp32.
    assert lanes(x).dtype == torch.float32
    want = Lanes(nets).losses(x, y).detach()
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)
    sd = lanes.lane_state_dict(0)
    assert {t.dtype for n, t in sd.items() if "num_batches" not in n} == {torch.float32}


def test_channels_last_lanes_reach_the_kernels_channels_last_and_agree():
    nets = _nets()
    x, y = _batches(1)[0]
    plain, cl = Lanes(nets), Lanes(nets, channels_last=True)
    spy = _ConvInputs()
    with spy:
        got = step(cl, sgd(cl, lr=0.1), x, y)
    assert spy.seen and all(s[1] for s in spy.seen)
    torch.testing.assert_close(got, step(plain, sgd(plain, lr=0.1), x, y), **F32)
    for i in range(L):
        for name, t in plain.lane_state_dict(i).items():
            torch.testing.assert_close(cl.lane_state_dict(i)[name], t, **F32)


def test_lanes_refuse_what_they_cannot_stack_or_feed():
    with pytest.raises(ValueError, match="same class and parameter shapes"):
        Lanes([Net(CLASSES, 4), Net(CLASSES, 8)])
    lanes = Lanes(_nets())
    with pytest.raises(ValueError, match=r"expected inputs \[L=3"):
        lanes(torch.randn(2, B, 3, SIDE, SIDE))
    with pytest.raises(ValueError, match="lane state_dict does not fit"):
        lanes.load_lane_state_dict(0, {"backbone.conv1.weight": torch.zeros(4, 3, 3, 3)})
    with pytest.raises(ValueError, match="compute_dtype must be None, float32 or bfloat16"):
        Lanes(_nets(), compute_dtype=torch.float16)
    with pytest.raises(IndexError, match="lane 3 out of range"):
        lanes.lane_state_dict(3)
    # A state of another class count: the key and both shapes, not copy_'s size message.
    other = Net(CLASSES + 1, WIDTH, "linear", dropout=0.0).state_dict()
    with pytest.raises(ValueError, match=r"lane 0's state 'head\.\w+' is \[11.*the lanes hold \[10"):
        lanes.load_lane_state_dict(0, other)


def test_lanes_refuse_networks_of_other_settings_or_dtypes():
    """The lanes run lane 0's module with every lane's tensors: a lane with another head scale ran
    at lane 0's (its logits a third of its own net's), and a float64 lane promoted every lane."""
    a = Net(CLASSES, WIDTH, "cosine", scale=10.0, dropout=0.0)
    with pytest.raises(ValueError, match=r"lane 1's network differs from lane 0's in head\.scale \(10\.0 against 30\.0\)"):
        Lanes([a, Net(CLASSES, WIDTH, "cosine", scale=30.0, dropout=0.0)])
    with pytest.raises(ValueError, match="lane 1's network differs from lane 0's in .*torch.float32 on cpu against torch.float64"):
        Lanes([a, Net(CLASSES, WIDTH, "cosine", scale=10.0, dropout=0.0).to(torch.float64)])


def test_laned_augmentation_is_each_lanes_own_augment_stream():
    """One call for all lanes draws what each lane's Augment would from its own generator, and
    leaves each generator where that single-run call would: the next draws agree too."""
    from pbr.data.augment import Augment
    from pbr.lanes import augment

    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)
    raw = torch.randint(0, 256, (L, B, 3, SIDE, SIDE), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    laned = [torch.Generator().manual_seed(10 + i) for i in range(L)]
    single = [torch.Generator().manual_seed(10 + i) for i in range(L)]
    for _ in range(2):
        got = augment(raw, laned, mean, std)
        for i in range(L):
            assert torch.equal(got[i], Augment(mean, std)(raw[i], single[i])), f"lane {i}"
    with pytest.raises(ValueError, match="one generator a lane"):
        augment(raw, laned[:2], mean, std)
