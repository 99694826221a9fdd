"""Lockstep lanes (pbr.lockstep): whole runs of a method, each in its own thread through the
unchanged task loop, their networks one stacked `Lanes`, must be the separate single runs: the
same weights, buffer and accuracy rows. In float64, as tests/test_lanes.py explains (at width 4 a
float32 run amplifies the last bits of grouped against single convolutions within a few steps;
in float64 they stay near 1e-11 here, where a fault in the wiring moves weights by 1e-3 and more)."""

import copy
import threading

import pytest
import torch

from pbr.lockstep import Rendezvous, train_laned
from pbr.loop import Observer, train_tasks
from pbr.methods import Context, create
from pbr.models import Net

WIDTH, SIDE, CLASSES, TASKS = 4, 8, 4, 2
SEEDS = (3, 11)


def _data(seed):
    """Two tasks of two classes each, 8x8 uint8 images, 12 training and 6 test images a class."""
    g = torch.Generator().manual_seed(seed)
    train, test = [], []
    for t in range(TASKS):
        for store, n in ((train, 12), (test, 6)):
            y = torch.arange(2 * t, 2 * t + 2).repeat_interleave(n)
            x = torch.randint(0, 256, (y.numel(), 3, SIDE, SIDE), generator=g, dtype=torch.uint8)
            store.append((x, y))
    return train, test


def _augment(raw, g):
    """A flip per image drawn from the run's own generator, then float64 in [0, 1]."""
    flip = torch.rand(raw.shape[0], generator=g) < 0.5
    x = torch.where(flip[:, None, None, None], raw.flip(3), raw)
    return x.to(torch.float64) / 255


def _run(seed, name="er", **settings):
    head = "cosine" if name == "pbr" else "linear"
    net = Net(CLASSES, WIDTH, head, dropout=0.0, generator=torch.Generator().manual_seed(seed)).to(torch.float64)
    ctx = Context(CLASSES, [torch.arange(2 * t, 2 * t + 2) for t in range(TASKS)], torch.device("cpu"), _augment,
                  lambda raw: raw.to(torch.float64) / 255, torch.Generator().manual_seed(seed), replay_batch_size=5,
                  eval_batch_size=7)
    if name == "pbr":
        # No training dropout (lanes draw it from the global generator, as single runs do, in
        # another order); the walk's MC dropout at 0.1 draws from each run's own generator.
        settings = {"mc_dropout": 0.1, "mc_samples": 3, **settings}
    return create(name, net, ctx, buffer_size=10, lr=0.05, **settings)


class Rows(Observer):
    def __init__(self):
        self.rows = []

    def task_done(self, task, stats, class_il, task_il):
        self.rows.append((class_il, task_il, [s.loss for s in stats]))


def _train(method, seed, rows):
    train, test = _data(seed)
    train_tasks(method, train, test, [2, 3], 6, eval_batch_size=7, observer=rows)


@pytest.mark.parametrize("name,settings", [("sgd", {}), ("er", {}), ("pbr", {}), ("er", {"lr_milestones": (0.5,)})])
def test_laned_runs_are_the_separate_runs(name, settings):
    """SGD (the plain step), ER (replay, reservoir) and PBR (its teacher's KL and prototype terms through a laned copy,
    the walk scoring each lane's own network with its own generator); ER under lr milestones too (a tenth of the lr
    from epoch 1 of the first task's 2, from epoch 2 of the second's 3: the lanes' one optimiser follows)."""
    singles, single_rows = [], []
    for s in SEEDS:
        m, rows = _run(s, name, **settings), Rows()
        _train(m, s, rows)
        singles.append(m)
        single_rows.append(rows.rows)

    laned = [_run(s, name, **settings) for s in SEEDS]
    laned_rows = [Rows() for _ in SEEDS]
    train_laned(laned, lambda i, m: _train(m, SEEDS[i], laned_rows[i]))

    for i, (a, b) in enumerate(zip(singles, laned)):
        assert type(b.net).__name__ == "Net"  # each run holds a network of its own again
        # its optimiser steps its own network again, not the stack the lanes shared
        assert {id(p) for g in b.opt.param_groups for p in g["params"]} == {id(p) for p in b.net.parameters()}
        if name == "pbr":
            assert type(b.teacher).__name__ == "Net" and a.teacher is not None
            assert not any(p.requires_grad for p in b.teacher.parameters())  # frozen, as a single run's
            for k, v in a.teacher.state_dict().items():
                torch.testing.assert_close(b.teacher.state_dict()[k], v, rtol=1e-9, atol=1e-9)
        want, got = a.net.state_dict(), b.net.state_dict()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-9, atol=1e-9, msg=lambda m: f"lane {i} {k}: {m}")
        # The buffer holds the same samples: the lane drew its replay and memory from its own generator.
        if a.buffer is not None:
            assert torch.equal(a.buffer.labels[: len(a.buffer)], b.buffer.labels[: len(b.buffer)])
            assert torch.equal(a.buffer.images[: len(a.buffer)], b.buffer.images[: len(b.buffer)])
        for (c1, t1, l1), (c2, t2, l2) in zip(single_rows[i], laned_rows[i].rows):
            assert c1 == c2 and t1 == t2
            assert l1 == pytest.approx(l2, abs=1e-10)
    # The two seeds trained differently: the comparison above could have failed.
    assert not torch.equal(singles[0].net.state_dict()["head.weight"], singles[1].net.state_dict()["head.weight"])


def test_a_method_that_changes_the_step_or_writes_into_its_network_runs_alone():
    with pytest.raises(ValueError, match="ewc_on changes the training step"):
        train_laned([_run(s, "ewc_on") for s in SEEDS], lambda i, m: None)
    with pytest.raises(ValueError, match="pbr with imprint writes into its network"):
        train_laned([_run(s, "pbr", imprint=True) for s in SEEDS], lambda i, m: None)
    # asked of every lane, not the first alone (its imprint went into a throwaway copy)
    with pytest.raises(ValueError, match="pbr with imprint writes into its network"):
        train_laned([_run(SEEDS[0], "pbr"), _run(SEEDS[1], "pbr", imprint=True)], lambda i, m: None)
    # a setting that is no tensor is lane 0's for every lane: lanes that differ in one are refused
    other = _run(SEEDS[1], "pbr")
    other.net.head.scale = 30.0
    with pytest.raises(ValueError, match=r"lane 1 differs from lane 0 in head.scale \(10.0 against 30.0\)"):
        train_laned([_run(SEEDS[0], "pbr"), other], lambda i, m: None)
    # bf16 autocast does not reach a laned forward's convolutions: such a run would train in fp32
    bf16 = [_run(s) for s in SEEDS]
    bf16[1].ctx.autocast_dtype = torch.bfloat16
    with pytest.raises(ValueError, match="a run under bf16 autocast runs alone"):
        train_laned(bf16, lambda i, m: None)
    # A method no test holds laned (DER++: a second forward on the buffer, its stored logits).
    with pytest.raises(ValueError, match="derpp has not been checked laned"):
        train_laned([_run(s, "derpp") for s in SEEDS], lambda i, m: None)
    # Every method either says so or is one this file checks.
    from pbr.methods import METHODS
    assert {n for n, c in METHODS.items() if c.__dict__.get("laned")} == {"sgd", "er", "pbr"}


def test_a_failing_lane_stops_the_others_and_every_run_gets_its_network_back():
    methods = [_run(s) for s in SEEDS]

    def run(i, m):
        if i == 1:
            raise KeyError("lane 1 broke")
        _train(m, SEEDS[i], Rows())  # lane 0 waits at its first step for a lane that never comes

    with pytest.raises(KeyError, match="lane 1 broke"):
        train_laned(methods, run)
    assert all(type(m.net).__name__ == "Net" and "step" not in vars(m) for m in methods)


def test_the_rendezvous_gives_each_its_own_result_and_stops_everyone_on_a_failure():
    meet = Rendezvous(3)
    got = [None] * 3

    def lane(i):
        got[i] = [meet.meet(i, i * 10 + r, lambda items: [sum(items) + k for k in range(3)]) for r in range(4)]

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    # Round r: items 0 + r, 10 + r, 20 + r; lane i gets sum + i.
    assert got == [[30 + 3 * r + i for r in range(4)] for i in range(3)]

    meet = Rendezvous(2)
    errors = []

    def waiting():
        try:
            meet.meet(0, 1, lambda items: items)
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=waiting)
    t.start()
    meet.abort(KeyError("lane 1 broke"))
    t.join(timeout=10)
    assert not t.is_alive() and isinstance(errors[0].__cause__, KeyError)
    with pytest.raises(RuntimeError):
        meet.meet(1, 2, lambda items: items)
    copy.copy(meet)  # a plain object: nothing of a lane's network inside


def _in_a_thread(target, seconds=60):
    """`target()` in a thread: (returned or raised, whether it was still running after `seconds`)."""
    out = {}

    def go():
        try:
            out["value"] = target()
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    return out, t.is_alive()


def test_a_lane_that_ends_early_stops_the_others_instead_of_hanging_them():
    """Lane 1 trains one task, lane 0 two: lane 0 waited forever at its next step."""
    methods = [_run(s) for s in SEEDS]

    def run(i, m):
        train, test = _data(SEEDS[i])
        n = 2 if i == 0 else 1
        train_tasks(m, train[:n], test[:n], [2, 3][:n], 6, eval_batch_size=7)

    out, hung = _in_a_thread(lambda: train_laned(methods, run))
    assert not hung
    assert "lane 1 finished its run while another lane still trains" in str(out["error"])


def test_an_error_of_the_shared_step_is_raised_as_itself(monkeypatch):
    """An out-of-memory error in the one step every lane shares reached the caller as RuntimeError
    "another lane failed", so `except torch.OutOfMemoryError` never fired."""
    def step(self, closure=None):
        raise torch.OutOfMemoryError("CUDA out of memory (the test's)")

    monkeypatch.setattr(torch.optim.SGD, "step", step)
    methods = [_run(s) for s in SEEDS]
    with pytest.raises(torch.OutOfMemoryError, match="the test's"):
        train_laned(methods, lambda i, m: _train(m, SEEDS[i], Rows()))


def test_an_interrupted_laned_training_stops_its_lanes_before_handing_back_the_networks():
    """Ctrl-C while the caller waits for the lanes: the lanes went on training, unlaned, on the
    networks the caller had been given back."""
    import os
    import signal
    import time

    methods = [_run(s) for s in SEEDS]
    started = threading.Event()

    def run(i, m):
        started.set()
        train, test = _data(SEEDS[i])
        train_tasks(m, train, test, [100, 100], 6, eval_batch_size=7)  # about 30 s unless stopped

    def interrupt():
        started.wait(30)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)  # a real signal: it wakes the caller's join

    # Ctrl-C's own handler (a pytest-xdist worker ignores SIGINT)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            train_laned(methods, run)
    finally:
        signal.signal(signal.SIGINT, old)
    assert not [t for t in threading.enumerate() if t.name.startswith("lane-") and t.is_alive()]
    before = [copy.deepcopy(m.net.state_dict()) for m in methods]
    time.sleep(0.3)
    for m, b in zip(methods, before):
        assert all(torch.equal(v, b[k]) for k, v in m.net.state_dict().items())


def test_lanes_of_other_settings_are_refused_in_one_line():
    """Lanes make the same calls on batches of one shape: a lane with another buffer size (its
    replay batch of another size) or another reading failed inside torch.stack, naming nothing."""
    with pytest.raises(ValueError, match=r"lane 1 differs from lane 0 in method setting buffer_size \(10 against 3\)"):
        train_laned([_run(0), create("er", _run(1).net, _run(1).ctx, buffer_size=3, lr=0.05)], lambda i, m: None)
    with pytest.raises(ValueError, match=r"lane 1 differs from lane 0 in method setting alpha"):
        train_laned([_run(0, "pbr"), _run(1, "pbr", alpha=0.0)], lambda i, m: None)


def test_lane_views_read_their_own_prototypes_while_the_others_do():
    """PBR's lanes ask for their prototypes at once from their threads; functional_call swaps a
    lane's tensors into the module it calls, which was one skeleton for every lane (a lane got
    another's prototypes, or the skeleton's meta tensors)."""
    import sys

    from pbr.lanes import Lanes
    from pbr.lockstep import LaneView, _Version

    nets = [Net(CLASSES, WIDTH, "cosine", dropout=0.0, generator=torch.Generator().manual_seed(s)) for s in (0, 1)]
    want = [n.prototypes().detach() for n in nets]
    lanes = Lanes(nets)
    views = [LaneView(lanes, i, Rendezvous(2), nets[i], _Version()) for i in range(2)]
    wrong, errors = [0, 0], []
    barrier = threading.Barrier(2)

    def ask(i):
        try:
            for _ in range(800):
                barrier.wait()
                wrong[i] += not torch.equal(views[i].prototypes().detach(), want[i])
        except Exception as e:  # noqa: BLE001 - the old code's meta tensors: reported below
            errors.append(repr(e)[:200])
            barrier.abort()

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        [t.start() for t in threads]
        [t.join(120) for t in threads]
    finally:
        sys.setswitchinterval(before)
    assert wrong == [0, 0] and not errors, (wrong, errors)
    assert lanes.skeleton.head.weight.device.type == "meta"


def test_lanes_of_shuffled_class_orders_train_as_their_separate_runs():
    """In the shuffled setting the class order follows the seed: lanes whose tasks hold other classes
    (of the same counts) are laned, each as its own run."""
    def run(seed, order):
        m = _run(seed)
        m.ctx.task_classes = [torch.tensor(t) for t in order]
        return m

    orders = ([[0, 1], [2, 3]], [[2, 3], [0, 1]])

    def data(seed, order):
        train, test = _data(seed)
        remap = {old: new for old, new in zip(range(4), [c for t in order for c in t])}
        return ([(x, y.apply_(remap.get)) for x, y in train], [(x, y.apply_(remap.get)) for x, y in test])

    alone = [run(s, o) for s, o in zip(SEEDS, orders)]
    for m, s, o in zip(alone, SEEDS, orders):
        train_tasks(m, *data(s, o), [2, 3], 6, eval_batch_size=7, observer=Rows())
    laned = [run(s, o) for s, o in zip(SEEDS, orders)]
    train_laned(laned, lambda i, m: train_tasks(m, *data(SEEDS[i], orders[i]), [2, 3], 6, eval_batch_size=7,
                                                 observer=Rows()))
    for a, b in zip(alone, laned):
        for (k, x), y in zip(a.net.state_dict().items(), b.net.state_dict().values()):
            assert torch.allclose(x, y, atol=1e-9), k
