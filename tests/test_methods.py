import pytest
import torch

from pbr.data.augment import Augment, normalize
from pbr.loop import Observer, evaluate, fit_task, train_tasks
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
    train_tasks(method, seen, [_task(t, n=4, seed=50) for t in range(n_tasks)], [epochs] * n_tasks, 8)
    return seen


class _Norms(Observer):
    def __init__(self, method):
        self.method, self.rows = method, []

    def task_done(self, task, stats, class_il, task_il):
        self.rows.append(self.method.classifier_norms().clone())


def test_every_method_learns_and_keeps_its_buffer_within_capacity():
    """Also: the weight-norm plot and the MC-dropout score read a classifier the method trains: its
    norms change from one task to the next, and the head MC dropout samples left its initial weights.
    (PODNet+ predicts with its LSC: the Net's head stays at its initialisation, and reporting it
    plotted random weights and scored a random head.)"""
    for name, cls in METHODS.items():
        method, ctx = _setup(name)
        before = _params(method.net)
        mc = method.mc_network()
        head0 = None if mc is None else mc.head.weight.detach().clone()
        norms = _Norms(method)
        train_tasks(method, [_task(t) for t in range(2)], [_task(t, n=4, seed=50) for t in range(2)], [1, 1], 8,
                    observer=norms)
        assert not torch.equal(before, _params(method.net)), name
        assert not torch.equal(norms.rows[0], norms.rows[1]), name
        mc = method.mc_network()
        assert mc is None or not torch.equal(head0, mc.head.weight.detach()), name
        if cls.uses_buffer:
            assert 0 < len(method.buffer) <= 16, name
            assert set(method.buffer.tasks[: len(method.buffer)].tolist()) <= {0, 1}
        else:
            assert method.buffer is None


def test_a_method_an_online_memory_feeds_reads_method_reservoir():
    """--budget proxy sets method.reservoir: first_epoch (each sample offered once a task, the validated
    stand-in); a method whose memory takes offered batches but does not declare the key ignored it
    without a word, and its proxy runs were not the proxy's (the docs' own example did so)."""
    from pbr.memory.base import Memory
    from pbr.methods import METHODS
    from pbr.methods.base import RESERVOIR

    online = [cls for cls in METHODS.values() if cls.memory is not None and cls.memory.offer is not Memory.offer]
    assert {cls.name for cls in online} >= {"er", "der", "derpp", "gss", "prs", "cbrs"}  # the rule sees them
    assert [cls.name for cls in online if RESERVOIR not in cls.settings] == []


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
    assert method.policy.class_counts.tolist() == [12.0, 12.0, 0.0, 0.0]
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
    """Counted by hand from the network's raw scores: with classes 0, 1 seen, Class-IL picks the
    larger of scores 0 and 1 (so task 1's classes 2, 3 are never right), Task-IL the larger of its
    own task's two. Batches of 5 over 16 images cross batch ends."""
    method, ctx = _setup("sgd")
    _run_tasks(method, ctx, n_tasks=1)  # a trained net: its scores are not all alike
    tests = [_task(t, n=16, seed=100) for t in range(2)]
    c, t = evaluate(method, tests, 1, 5)
    method.net.eval()
    with torch.no_grad():
        raw = [method.net(ctx.preprocess(x)) for x, _ in tests]

    def percent(scores, labels, a, b):  # % of images whose larger of scores a, b is their label
        picked = [a if float(row[a]) >= float(row[b]) else b for row in scores]
        return 100 * sum(p == int(y) for p, y in zip(picked, labels)) / len(labels)

    assert c == [percent(raw[0], tests[0][1], 0, 1), 0.0]
    assert t == [percent(raw[0], tests[0][1], 0, 1), percent(raw[1], tests[1][1], 2, 3)]
    assert 0 < t[1] < 100  # an untrained pair of classes: the comparison could go either way


@pytest.mark.parametrize("name", ["sgd", "pnn"])  # PNN predicts twice a batch (once with the task's column)
def test_after_each_task_only_the_learned_tasks_test_sets_are_scored(name):
    """After task k the test sets of tasks 0..k are predicted, no later one (read by no metric:
    Class-IL 0 by its mask, Task-IL chance), and the row says those are not evaluated: None. The
    test sets' sizes differ, so the images predicted say which were scored."""
    method, ctx = _setup(name, n_classes=6, n_tasks=3)
    sizes = [3, 5, 11]
    predicted = []
    predict = method.predict
    method.predict = lambda x, task=None: predicted.append(x.shape[0]) or predict(x, task)

    class Rows(Observer):
        rows = []

        def task_done(self, task, stats, class_il, task_il):
            self.rows.append((sum(predicted), class_il, task_il))
            predicted.clear()

    train_tasks(method, [_task(t) for t in range(3)], [_task(t, n=n, seed=50) for t, n in enumerate(sizes)],
                [1] * 3, 8, eval_batch_size=4, observer=Rows())
    calls = 2 if name == "pnn" else 1
    assert [r[0] for r in Rows.rows] == [calls * 3, calls * 8, calls * 19]  # not 19 after every task
    for k, (_, c, t) in enumerate(Rows.rows):
        assert c[k + 1:] == t[k + 1:] == [None] * (2 - k)
        assert all(isinstance(v, float) for v in c[: k + 1] + t[: k + 1])


class _Fixed(METHODS["sgd"]):
    """Predicts class 1 without the task identity and the task's last class with it."""

    uses_task_identity = True

    def predict(self, x, task=None):
        scores = torch.zeros(x.shape[0], self.ctx.n_classes)
        scores[:, 1 if task is None else int(self.ctx.task_classes[task][-1])] = 1.0
        return scores


def test_evaluation_goes_through_the_methods_own_prediction():
    """Class-IL asks predict() without the task, Task-IL with it (when the method uses it)."""
    method, ctx = _setup("sgd")
    method = _Fixed(method.net, ctx, method.opts)
    labels = torch.tensor([0, 1, 1, 1, 2, 3, 3, 2])  # task 0: classes 0, 1; task 1: classes 2, 3
    images = torch.zeros(8, 3, 32, 32, dtype=torch.uint8)
    tests = [(images[:4], labels[:4]), (images[4:], labels[4:])]
    c, t = evaluate(method, tests, 2, 3)
    assert c == [75.0, 0.0]  # three of task 0's four are class 1; task 1 has none
    assert t == [75.0, 50.0]  # the last class of each task: 1 (three of four), 3 (two of four)


class _Watched(METHODS["sgd"]):
    """Records the grad modes each prediction ran in."""

    def predict(self, x, task=None):
        self.modes.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        return super().predict(x, task)


def test_evaluation_under_cuda_graphs_makes_no_inference_tensors():
    """Under `train.compile: graphs` the evaluation runs without grad but outside inference mode
    (inference tensors in the graphs' memory pool break the training graphs recorded after them),
    with the same accuracies as the usual inference-mode pass."""
    method, ctx = _setup("sgd")
    _run_tasks(method, ctx, n_tasks=1)
    method = _Watched(method.net, ctx, method.opts)
    tests = [_task(t, n=16, seed=100) for t in range(2)]
    got = {}
    for graphs in (False, True):
        ctx.cuda_graphs, method.modes = graphs, []
        got[graphs] = evaluate(method, tests, 1, 5)
        assert set(method.modes) == {(False, not graphs)} and len(method.modes) == 8
    assert got[True] == got[False]


class _Hooked(METHODS["sgd"]):
    def penalty(self):
        return sum((p ** 2).sum() for p in self.net.parameters()) * 0 + 5.0

    def after_backward(self):
        for p in self.net.parameters():
            p.grad = None if p.grad is None else torch.zeros_like(p.grad)  # a projection onto {0}

    def after_step(self):
        self.steps = getattr(self, "steps", 0) + 1


def test_step_hooks_penalty_gradient_change_and_after_step():
    method, ctx = _setup("sgd")
    method = _Hooked(method.net, ctx, method.opts)
    images, labels = _task(0)
    method.begin_task(0, images, labels)
    before = _params(method.net)
    plain, _ = _setup("sgd")
    plain.begin_task(0, images, labels)
    x = ctx.augment(images[:8], torch.Generator().manual_seed(3))
    loss = method.observe(x, labels[:8], images[:8])
    assert torch.equal(_params(method.net), before)  # zeroed gradients: SGD without momentum moves nothing
    assert method.steps == 1
    assert loss.item() == pytest.approx(plain.observe(x, labels[:8], images[:8]).item() + 5.0, rel=1e-5)



def test_lr_milestones_train_as_mammoths_multisteplr_restarted_each_task():
    """An independent reference: two tasks of four epochs under lr_milestones (0.5, 0.75) against a
    hand-written loop of the same draws, with torch's MultiStepLR([2, 3], gamma 0.1) stepped after
    each epoch on an SGD built at each task's start (Mammoth's get_scheduler): the same weights.
    The same run at a constant lr ends elsewhere (the comparison could fail)."""
    import copy

    import torch.nn.functional as F

    def ours(milestones):
        method, _ = _setup("sgd", lr=0.1, lr_milestones=milestones)
        start = copy.deepcopy(method.net)
        for k in range(2):
            images, labels = _task(k)
            method.begin_task(k, images, labels)
            fit_task(method, images, labels, 4, 8)
        return method.net, start

    trained, net = ours((0.5, 0.75))
    g, augment = torch.Generator().manual_seed(0), Augment(MEAN, STD)  # _setup's generator
    net.train()
    for k in range(2):
        images, labels = _task(k)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.MultiStepLR(opt, [2, 3], gamma=0.1)
        for _ in range(4):
            perm = torch.randperm(24, generator=g)
            for s in range(0, 24, 8):
                idx = perm[s:s + 8]
                opt.zero_grad()
                F.cross_entropy(net(augment(images[idx], g)), labels[idx]).backward()
                opt.step()
            schedule.step()
    assert torch.equal(_params(trained), _params(net))
    constant, _ = ours(())
    assert not torch.equal(_params(constant), _params(net))


def test_every_methods_optimiser_follows_lr_milestones_in_every_param_group():
    """(0.7, 0.9) of 50 epochs: a tenth of the lr from epoch 35 on, a hundredth from 45, as Mammoth's
    MultiStepLR([35, 45]) stepped after each epoch, in every param group of each method's optimiser
    (PODNet+'s holds its LSC as well as the network)."""
    ref = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    schedule = torch.optim.lr_scheduler.MultiStepLR(ref, [35, 45], gamma=0.1)
    want = []
    for _ in range(50):
        want.append(ref.param_groups[0]["lr"])
        ref.step()
        schedule.step()
    assert want[34] == 0.1 and want[35] == want[44] == 0.1 * 0.1 and want[45] == want[49] == 0.1 * 0.1 * 0.1
    for name in METHODS:
        method, _ = _setup(name, lr=0.1, lr_milestones=(0.7, 0.9))
        method.begin_task(0, *_task(0))
        got = []
        for e in range(50):
            method.begin_epoch(e, 50)
            got.append({g["lr"] for g in method.opt.param_groups})
        assert got == [{lr} for lr in want], name
        method.begin_task(1, *_task(1))  # a fresh optimiser: the schedule starts again
        method.begin_epoch(0, 50)
        assert {g["lr"] for g in method.opt.param_groups} == {0.1}, name


def test_a_methods_defaults_need_name_only_what_it_changes():
    """A new method's `defaults = {"lr": 0.05}` (the natural way to write its own lr) left head,
    dropout and weight decay unresolved: `pbr train` ended in a traceback (KeyError: no value for
    'head'). The rest come from the common protocol's."""
    from pbr.methods.base import ContinualMethod

    class Mine(ContinualMethod):
        name = "mine-test"
        defaults = {"lr": 0.05}

    opts, sources = Mine.options()
    assert (opts.lr, sources["lr"]) == (0.05, Mine.defaults_source)
    assert Mine.resolve("head", "auto", "cifar10", 200) == ("linear", ContinualMethod.defaults_source)
    assert Mine.resolve("dropout", "auto", "cifar10", 200)[0] == 0.0
    with pytest.raises(KeyError, match="no value for 'gamma'"):
        Mine.resolve("gamma", "auto", "cifar10", 200)


def test_a_milestone_rounding_to_epoch_0_drops_after_the_first_epoch():
    """0.1 of 4 epochs rounds to 0: the whole task trained at a tenth of its lr. Hand-counted: the
    drop comes after epoch 1 (the earliest a per-epoch step can), 0.5 after epoch 2."""
    from pbr.methods.base import milestone_drops

    assert [milestone_drops((0.1,), e, 4) for e in range(4)] == [0, 1, 1, 1]
    assert [milestone_drops((0.1, 0.5), e, 4) for e in range(4)] == [0, 1, 2, 2]


def test_a_methods_role_is_one_the_grids_know_and_extra_runs_in_families_only(monkeypatch):
    """The default role "baseline" puts a new method in the paper's Table 2 grid; "extra" keeps it
    out of every paper grid but `families`. Any other word (a typo) left it out of all of them
    silently: it is refused where the class is written, naming the method and the roles."""
    from conftest import ROOT
    from pbr.methods.er import ER
    from stages.experiments import sweep
    from stages.runtime.yaml12 import read_params

    with pytest.raises(TypeError, match=r"^method 'mine' \(Mine\): role 'baselines' is not one of bound \| baseline "
                                        r"\| ltcl \| ours \| extra \(extra: a method the paper does not run"):
        class Mine(ER):
            name, label, role = "mine", "Mine", "baselines"

    base = read_params(ROOT / "params.yaml")

    def grids_of(cls):
        monkeypatch.setitem(METHODS, "mine", cls)
        return [g for g, cells in sweep.GRIDS.items() if any(c["method.name"] == "mine" for c in cells(base))]

    class Extra(ER):
        name, label, role = "mine", "Mine", "extra"

    class Baseline(ER):
        name, label = "mine", "Mine"

    assert grids_of(Extra) == ["families"]
    assert grids_of(Baseline) == ["table2", "families"]


def test_a_subclass_that_kept_its_parents_name_is_refused_not_swapped_in():
    """class Mine(ER) without a name of its own is named "er": in the registry it replaced ER, so
    every `method.name: er` run trained Mine, silently."""
    from pbr.methods import registry
    from pbr.methods.er import ER

    class Mine(ER):
        label = "Mine"

    with pytest.raises(TypeError, match=r"^methods ER and Mine are both named 'er': give Mine a name of its own"):
        registry((ER, Mine))
    assert registry((ER,)) == {"er": ER}
