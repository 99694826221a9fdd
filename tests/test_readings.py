"""The paper's open readings, each switched by a method option and pinned on hand-made numbers
(docs/method.md lists them): the walk's offset counts, the MI's logit scale, the KL's
normalisation, weight imprinting, and the reservoir that counts each sample once."""

import copy
import math

import pytest

import torch
import torch.nn.functional as F

from pbr.selection import sample_in_probability
from pbr.loop import fit_task
from pbr.data.augment import normalize
from pbr.models.net import Net
from pbr.uncertainty import mc_features, mc_probs, mutual_information, score_and_predict, score_images
from test_methods import MEAN, STD, _run_tasks, _setup, _task


def _uneven_tasks():
    """Task 0: 20 images of class 0 and 10 of class 1; task 1: 3 of class 2 and 3 of class 3."""
    g = torch.Generator().manual_seed(5)
    t0 = (torch.randint(0, 256, (30, 3, 32, 32), dtype=torch.uint8, generator=g),
          torch.tensor([0] * 20 + [1] * 10))
    t1 = (torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=g), torch.tensor([2, 3] * 3))
    return t0, t1


def _finish_tasks(method, tasks):
    for t, (images, labels) in enumerate(tasks):
        method.begin_task(t, images, labels)
        fit_task(method, images, labels, 1, 8)
        method.end_task(t, images, labels)


def test_offset_counts_classes_or_tasks():
    tasks = _uneven_tasks()
    by_class, _ = _setup("pbr", offset="class")
    by_task, _ = _setup("pbr", offset="task")
    for m in (by_class, by_task):
        _finish_tasks(m, tasks)
    assert by_class.policy.offset_counts().tolist() == [20.0, 10.0, 3.0, 3.0]
    assert by_task.policy.offset_counts().tolist() == [30.0, 6.0]
    # Hand computation of P_1 = |M| / (1 + sum_i s_i w_i), w = softmax(-s), buffer 16.
    def offset(s):
        z = sum(math.exp(-v) for v in s)
        return sum(v * math.exp(-v) / z for v in s)
    assert abs(offset([20, 10, 3, 3]) - 3.0) < 5e-3 and abs(offset([30, 6]) - 6.0) < 1e-9
    for m, s in ((by_class, [20, 10, 3, 3]), (by_task, [30, 6])):
        p1 = sample_in_probability(1, m.policy.offset_counts(), 16)[0].item()
        assert math.isclose(p1, 16 / (1 + offset(s)), rel_tol=1e-12)


def test_offset_counts_survive_a_resume():
    method, _ = _setup("pbr", offset="task")
    _finish_tasks(method, _uneven_tasks()[:1])
    again, _ = _setup("pbr", offset="task")
    again.load_state_dict(method.state_dict())
    assert again.policy.offset_counts().tolist() == [30.0]


def _two_prototype_net(method):
    """Prototypes e1 (class 0) and e2 (class 1); a feature along e1 has cos = [1, 0, ...]."""
    net = method.net
    with torch.no_grad():
        net.head.weight.zero_()
        net.head.weight[0, 0] = 3.0  # the cosine head normalises: the norm does not matter
        net.head.weight[1, 1] = 0.5
    feats = torch.zeros(1, net.feature_dim)
    feats[0, 0] = 7.0
    return feats


def test_mi_scale_scaled_or_cosine():
    """s = 10, tau1 = 0.1: the head's logits over tau1 give scores 100 * cos, the paper's MC
    equation cos / tau1 = 10 * cos."""
    expect = {"scaled": 1 / (1 + math.exp(-100.0)), "cosine": 1 / (1 + math.exp(-10.0))}
    for reading, p0 in expect.items():
        method, _ = _setup("pbr", mi_logits=reading, tau1=0.1)
        feats = _two_prototype_net(method)
        method.net.head.p = 0.0  # no dropout: the probabilities are the plain softmax
        probs = mc_probs(method.net, feats, 2, method.mi_temperature(), torch.Generator(),
                         classes=torch.tensor([0, 1]))
        assert math.isclose(probs[0, 0, 0].item(), p0, rel_tol=1e-6), reading
        assert math.isclose(probs[0, 0, 1].item(), 1 - p0, rel_tol=1e-3, abs_tol=1e-30), reading


def test_mi_at_the_head_scale_ties_more_samples_at_zero():
    """Features of a fitted net lie near their class's prototype. At 100 * cos most such samples'
    MC softmaxes saturate, so their MI rounds to 0 and the walk's order among them is arbitrary;
    at 10 * cos they are ranked."""
    zeros = {}
    for reading in ("scaled", "cosine"):
        method, _ = _setup("pbr", mi_logits=reading, tau1=0.1)
        net = method.net
        net.head.p = 0.1
        g = torch.Generator().manual_seed(0)
        gf = torch.Generator().manual_seed(3)
        y = torch.randint(0, 4, (400,), generator=gf)
        noise = torch.randn(400, net.feature_dim, generator=gf) / net.feature_dim ** 0.5
        feats = net.prototypes().detach()[y] + 0.5 * noise
        mi, _ = mutual_information(mc_probs(net, feats, 20, method.mi_temperature(), g))
        zeros[reading] = (mi < 1e-6).float().mean().item()
    assert zeros["scaled"] > zeros["cosine"] + 0.2, zeros


class _Fixed(torch.nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, x):
        return self.logits.expand(x.shape[0], -1)


def test_kl_over_old_or_all_seen_classes():
    """Task 1 of 2 (classes 0, 1 old; 2, 3 new), tau2 = 1. Teacher logits [1, 0, 0, 0],
    student [0, 0, 1, 1]. (Here the head's classes are the seen ones: `head` in the next test.)"""
    e = math.e
    # old: p_T = softmax([1, 0]), p_S = [1/2, 1/2]
    pt = [e / (e + 1), 1 / (e + 1)]
    old = sum(p * math.log(p / 0.5) for p in pt)
    # all: P_T = softmax([1, 0, 0, 0]), P_S = softmax([0, 0, 1, 1]), summed over classes 0 and 1
    PT = [e / (e + 3), 1 / (e + 3)]
    PS = 1 / (2 + 2 * e)
    every = sum(p * math.log(p / PS) for p in PT)
    assert abs(old - 0.1109) < 1e-3 and abs(every - 0.6462) < 1e-3
    student = torch.tensor([[0.0, 0.0, 1.0, 1.0]], requires_grad=True)
    for reading, want in (("old", old), ("all", every)):
        method, _ = _setup("pbr", kl_classes=reading, tau2=1.0)
        method.task = 1
        method.teacher = _Fixed(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
        loss = method._distill(torch.zeros(1, 3, 32, 32), student, torch.tensor([0, 1]))
        assert math.isclose(loss.item(), want, rel_tol=1e-5), reading
        (grad,) = torch.autograd.grad(loss, student)
        if reading == "old":
            assert grad[0, 2:].abs().max() == 0  # new-class logits untouched
        else:
            assert (grad[0, 2:] > 0).all()  # gradient descent pushes them down on buffer samples


def test_kl_at_tau2_is_the_batch_mean_of_each_rows_divergence():
    """tau2 = 2, two buffer rows, reading `old` (classes 0, 1): teacher [1, 0 | 0, 0] and
    [0, 2 | 0, 0], student [0, 0 | 1, 1] and [1, 0 | 1, 1]. By hand: row 1 KL(softmax[.5, 0] ||
    [.5, .5]), row 2 KL(softmax[0, 1] || softmax[.5, 0]), their mean 0.1438515 (the loss divided
    by tau2 inside both softmaxes; a sum over rows would double it)."""
    def sm(v):
        z = [math.exp(a) for a in v]
        return [a / sum(z) for a in z]

    def kl(p, q):
        return sum(a * math.log(a / b) for a, b in zip(p, q))

    want = (kl(sm([0.5, 0]), [0.5, 0.5]) + kl(sm([0, 1]), sm([0.5, 0]))) / 2
    assert abs(want - 0.1438515) < 1e-6
    method, _ = _setup("pbr", kl_classes="old", tau2=2.0)
    method.task = 1
    method.teacher = _Fixed(torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]]))
    student = torch.tensor([[0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0]])
    loss = method._distill(torch.zeros(2, 3, 32, 32), student, torch.tensor([0, 1]))
    assert math.isclose(loss.item(), want, rel_tol=1e-5)


def test_kl_over_the_heads_every_class():
    """Task 1 of 3 (classes 0, 1 old; 2, 3 new; 4, 5 later), tau2 = 1. Teacher logits [1, 0, 0, 0, 0, 0],
    student [0, 0, 1, 1, 0, 0]: the later classes take their share of both softmaxes."""
    e = math.e
    PT = [e / (e + 5), 1 / (e + 5)]
    PS = 1 / (4 + 2 * e)
    want = {"head": sum(p * math.log(p / PS) for p in PT),
            "all": sum(p * math.log(p / (1 / (2 + 2 * e))) for p in [e / (e + 3), 1 / (e + 3)])}
    assert abs(want["head"] - 0.4490) < 1e-3 and abs(want["all"] - 0.6462) < 1e-3
    student = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0, 0.0]], requires_grad=True)
    for reading in ("head", "all"):
        method, _ = _setup("pbr", n_classes=6, n_tasks=3, kl_classes=reading, tau2=1.0)
        method.task = 1
        method.teacher = _Fixed(torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]))
        loss = method._distill(torch.zeros(1, 3, 32, 32), student, torch.tensor([0, 1]))
        assert math.isclose(loss.item(), want[reading], rel_tol=1e-5), reading
        (grad,) = torch.autograd.grad(loss, student)
        assert ((grad[0, 4:] > 0).all() if reading == "head" else grad[0, 4:].abs().max() == 0), reading


def test_imprinting_points_new_prototypes_at_their_mean_feature():
    for imprint in (False, True):
        method, ctx = _setup("pbr", imprint=imprint)
        images0, labels0 = _task(0)
        method.begin_task(0, images0, labels0)
        method.end_task(0, images0, labels0)
        before = method.net.head.weight.detach().clone()
        images1, labels1 = _task(1)
        method.begin_task(1, images1, labels1)
        after = method.net.head.weight.detach()
        assert torch.equal(after[:2], before[:2])  # old classes untouched
        net = method.net.eval()
        with torch.no_grad():
            f = F.normalize(net.features(ctx.preprocess(images1)), dim=1)
        for c in (2, 3):
            cos = F.cosine_similarity(after[c], f[labels1 == c].mean(0), dim=0).item()
            assert (cos > 0.9999) == imprint, (imprint, c, cos)


def test_reservoir_offers_each_sample_once_per_task_with_first_epoch():
    """ER's online reservoir counts offered samples: every epoch (Mammoth) or the first only."""
    for reservoir, per_epoch in (("every_epoch", 3), ("first_epoch", 1)):
        method, ctx = _setup("er", reservoir=reservoir)
        images, labels = _task(0)
        method.begin_task(0, images, labels)
        fit_task(method, images, labels, 3, 8)
        assert method.policy.seen == 24 * per_epoch, reservoir


def test_pbr_reservoir_sampling_fills_the_buffer_online_and_skips_the_walk():
    """sampling: reservoir (the paper's "random reservoir sampling" read as Vitter's): the buffer
    fills during training by ER's rule, and the end of a task leaves it as it is; the walk
    (sampling: walk) stores nothing online and fills the buffer at the end of the task."""
    images, labels = _task(0)
    stream = {bytes(x.numpy().tobytes()) for x in images}
    for reservoir, per_epoch in (("every_epoch", 2), ("first_epoch", 1)):
        method, _ = _setup("pbr", sampling="reservoir", reservoir=reservoir)
        method.begin_task(0, images, labels)
        fit_task(method, images, labels, 2, 8)
        assert method.policy.seen == 24 * per_epoch and len(method.buffer) == 16, reservoir
        stored = [bytes(x.numpy().tobytes()) for x in method.buffer.images[:16]]
        assert set(stored) <= stream
        if reservoir == "first_epoch":  # each sample offered once: no sample twice
            assert len(set(stored)) == 16
        before = method.buffer.images.clone()
        method.end_task(0, images, labels)
        assert torch.equal(method.buffer.images, before) and method.policy.seen == 24 * per_epoch

    walk, _ = _setup("pbr", sampling="walk")
    walk.begin_task(0, images, labels)
    fit_task(walk, images, labels, 2, 8)
    assert len(walk.buffer) == 0 and walk.policy.seen == 0
    walk.end_task(0, images, labels)
    assert len(walk.buffer) > 0


# ------------------------------------------------------------------ readings never tried before

def _before(order, i, j, n=4000, **kw):
    """How often sample i comes before sample j in `n` draws of the walk order."""
    from pbr.selection import walk_order

    g = torch.Generator().manual_seed(0)
    scores = kw.pop("scores")
    hits = 0
    for _ in range(n):
        perm = walk_order(scores, order, g, **kw).tolist()
        hits += perm.index(i) < perm.index(j)
    return hits / n


def test_certain_weighted_order_draws_with_the_odds_of_each_samples_certainty():
    """Eq. 3's arg min drawn with odds: certainty = the task's largest MI minus the sample's. With
    A-Res keys, i precedes j with probability w_i / (w_i + w_j): MI 0, 0.5, 1 give certainties 1,
    0.5, 0, so sample 0 precedes sample 1 two times in three, and sample 2 (certainty 0) is last."""
    scores = torch.tensor([0.0, 0.5, 1.0])
    assert abs(_before("certain_weighted", 0, 1, scores=scores) - 2 / 3) < 0.03
    assert _before("certain_weighted", 1, 2, n=300, scores=scores) == 1.0
    # The uncertain-weighted order is its mirror: sample 2 before sample 1 with odds 1 : 0.5.
    assert abs(_before("uncertain_weighted", 2, 1, scores=scores) - 2 / 3) < 0.03


def test_certain_weighted_order_measures_certainty_from_the_tasks_largest_mi():
    """MI is usually far below 1: 0, 0.05, 0.1 give certainties 0.1, 0.05, 0 (not 1 - MI = 1, 0.95,
    0.9, an order nearly uniform), so sample 2 is always last and sample 0 precedes 1 two times in three."""
    scores = torch.tensor([0.0, 0.05, 0.1])
    assert _before("certain_weighted", 1, 2, n=300, scores=scores) == 1.0
    assert abs(_before("certain_weighted", 0, 1, n=2000, scores=scores) - 2 / 3) < 0.04


def test_mi_power_sharpens_the_weighted_order():
    """Weights MI^p: MI 1 and 2 give odds 1 : 2 at p = 1 and 1 : 4 at p = 2 (sample 1 first 4/5)."""
    scores = torch.tensor([1.0, 2.0])
    assert abs(_before("uncertain_weighted", 1, 0, scores=scores) - 2 / 3) < 0.03
    assert abs(_before("uncertain_weighted", 1, 0, scores=scores, power=2.0) - 4 / 5) < 0.03
    assert abs(_before("uncertain_weighted", 1, 0, scores=scores, power=0.5) - math.sqrt(2) / (1 + math.sqrt(2))) < 0.03


def test_walk_ranked_per_class_interleaves_the_classes():
    """Most uncertain first over 3 samples of class 0 and 2 of class 1 (MI 5, 4, 3 and 2, 1): over
    the task the order is 0 1 2 3 4; per class, each class's first sample comes before any class's
    second: 0 3 1 4 2, so the minority class reaches the front."""
    from pbr.selection import walk_order

    scores, labels = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0]), torch.tensor([0, 0, 0, 1, 1])
    g = torch.Generator().manual_seed(0)
    assert walk_order(scores, "uncertain_first", g).tolist() == [0, 1, 2, 3, 4]
    assert walk_order(scores, "uncertain_first", g, labels=labels, rank="class").tolist() == [0, 3, 1, 4, 2]
    assert walk_order(scores, "certain_first", g, labels=labels, rank="class").tolist() == [4, 2, 3, 1, 0]


def test_the_most_uncertain_samples_can_be_left_out_of_the_walk():
    """mi_outliers 0.4 of 5 samples leaves the 2 highest MI out; a buffer large enough to take
    every candidate (P_N = 100 / N >= 1) then holds exactly the other 3."""
    from pbr.buffer import Buffer
    from pbr.memory.walk import UncertaintyWalk

    images = torch.arange(5, dtype=torch.uint8).view(5, 1, 1, 1).expand(5, 3, 2, 2).contiguous()
    labels = torch.tensor([0, 1, 0, 1, 0])
    scores = torch.tensor([0.9, 0.1, 0.5, 0.7, 0.3])
    buf = Buffer(100, (3, 2, 2), 2, torch.device("cpu"))
    walk = UncertaintyWalk(buf, torch.Generator().manual_seed(0), order="random", outliers=0.4)
    accepted = walk.walk(images, labels, torch.zeros(5, dtype=torch.int64), scores, torch.tensor([]))
    assert accepted.tolist() == [False, True, True, False, True]
    assert sorted(buf.images[: len(buf), 0, 0, 0].tolist()) == [1, 2, 4]


def test_mi_scored_by_the_previous_tasks_model():
    """mi_model teacher: the walk after task 1 scores the task with the model of the end of task 0,
    so its stored scores are what that model gives, not what the model just fitted gives."""
    import copy

    from pbr.uncertainty import score_images

    tasks = _uneven_tasks()
    runs = {}
    for mi_model in ("final", "teacher"):
        m, ctx = _setup("pbr", mi_model=mi_model, buffer_order="uncertain_first", walk_candidate="hold")
        _finish_tasks(m, tasks[:1])
        old = copy.deepcopy(m.net)
        images, labels = tasks[1]
        m.begin_task(1, images, labels)
        fit_task(m, images, labels, 1, 8)
        state = ctx.generator.get_state()
        want = {}
        for name, net in (("teacher", old), ("final", m.net)):
            ctx.generator.set_state(state)
            want[name], _ = score_images(net, images, m.opts.mc_samples, m.mi_temperature(), ctx.eval_batch_size,
                                         ctx.preprocess, ctx.generator, classes=ctx.seen_classes(1))
        ctx.generator.set_state(state)
        m.end_task(1, images, labels)
        stored = m.buffer.scores[: len(m.buffer)][m.buffer.tasks[: len(m.buffer)] == 1]
        runs[mi_model] = (stored, want)
    for mi_model, (stored, want) in runs.items():
        assert stored.numel() > 0
        # Strictly most uncertain first with hold: the k stored samples are the k highest scores.
        top = want[mi_model].sort(descending=True).values[: stored.numel()]
        assert torch.allclose(stored.sort(descending=True).values, top.to(stored.dtype)), mi_model
    assert not torch.allclose(runs["final"][1]["final"], runs["final"][1]["teacher"])


# ------------------------------------------------- which sample leaves, the pool, the scoring's dropout

def _ids(ids):
    """Images whose every pixel is the sample's id, so a stored image says which sample it is."""
    return torch.tensor(ids, dtype=torch.uint8).view(-1, 1, 1, 1).expand(len(ids), 3, 2, 2).contiguous()


def _stored(capacity, ids, scores):
    """A full buffer holding samples `ids` of task 0 with these stored scores."""
    from pbr.buffer import Buffer

    buf = Buffer(capacity, (3, 2, 2), 4, torch.device("cpu"))
    n = len(ids)
    buf.write(torch.arange(n), _ids(ids), torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64),
              scores=torch.tensor(scores))
    buf.size = n
    return buf


def _held(buf):
    return buf.images[: len(buf), 0, 0, 0].tolist(), [round(v, 6) for v in buf.scores[: len(buf)].tolist()]


def test_evict_by_stored_score_replaces_the_lowest_or_highest_slot():
    """Buffer of 3 full of samples 10, 11, 12 with stored MI 0.4, 0.1, 0.7; the task's samples 1 and
    2 (MI 0.5, 0.2) walked most uncertain first. No offset: P_1 = 3, P_2 = 1.5, both accepted.
    certain: 1 replaces the lowest (slot 1, 0.1), then 2 the lowest left (slot 0, 0.4).
    uncertain: 1 replaces the highest (slot 2, 0.7); the highest is then 1's own 0.5, so 2 replaces it."""
    from pbr.memory.walk import UncertaintyWalk

    want = {"certain": ([2, 1, 12], [0.2, 0.5, 0.7]), "uncertain": ([10, 11, 2], [0.4, 0.1, 0.2])}
    for evict, held in want.items():
        buf = _stored(3, [10, 11, 12], [0.4, 0.1, 0.7])
        walk = UncertaintyWalk(buf, torch.Generator().manual_seed(0), order="uncertain_first", candidate="hold",
                               evict=evict)
        accepted = walk.walk(_ids([1, 2]), torch.tensor([1, 1]), torch.ones(2, dtype=torch.int64),
                             torch.tensor([0.5, 0.2]), torch.tensor([]))
        assert accepted.tolist() == [True, True]
        assert _held(buf) == held, evict
        assert buf.tasks.tolist() == ([1, 1, 0] if evict == "certain" else [0, 0, 1])


def test_evict_random_placed_one_by_one_equals_the_vectorised_walk():
    """The one-acceptance-at-a-time placement (used by evict certain/uncertain and the pool) with a
    random slot and nothing stored in the pool writes exactly what the default vectorised walk does:
    free slots in walk order, then the drawn random slots, a later write winning."""
    from pbr.memory.walk import UncertaintyWalk

    g = torch.Generator().manual_seed(7)
    ids, scores = list(range(40)), torch.rand(40, generator=g)
    labels = torch.arange(40) % 4
    bufs = []
    for stored in (None, torch.full((40,), -1)):
        buf = _stored(8, [100, 101, 102], [0.3, 0.2, 0.1])
        walk = UncertaintyWalk(buf, torch.Generator().manual_seed(3), order="uncertain_weighted", candidate="hold")
        walk.walk(_ids(ids), labels, torch.ones(40, dtype=torch.int64), scores, torch.tensor([5.0, 9.0]), stored=stored)
        bufs.append(buf)
    assert len(bufs[0]) == 8 and _held(bufs[0]) == _held(bufs[1])
    assert any(i < 100 for i in _held(bufs[0])[0]) and len(set(_held(bufs[0])[0])) == 8


class _Rescorer:
    """A learner whose model scores each sample by its id (as the model just fitted would)."""

    def __init__(self, mi):
        self.mi, self.calls = mi, []

    def memory_scores(self, task, images, labels):
        ids = images[:, 0, 0, 0].tolist()
        self.calls.append(ids)
        return torch.tensor([self.mi[i] for i in ids])


def test_walk_over_buffer_and_task_rescores_the_stored_samples_and_drops_an_old_one():
    """Buffer of 3: samples 10, 11, 12 with stale MI 0.9, 0.8, 0.2. The model now scores them 0.1,
    0.8, 0.6, and the task's samples 1, 2 at 0.5, 0.3; most uncertain first, hold, evict certain, no
    offset (P_N = 3 / N).
    task: the walk over 1, 2 (P 3, 1.5) stores 1 over 12 (stale 0.2), then 2 over 1 (0.5): 10 stays
    with its stale 0.9.
    buffer_and_task: the walk over 11, 12, 1, 2, 10 (P 3, 1.5, 1, 0.75, 0.6): steps 1 and 2 accept
    11 and 12, stored already, so nothing is written (writing them again would evict 10 and then
    12); step 3 stores 1 over the lowest re-scored slot, 10's (0.1); the seed's u_4 >= 0.75 and
    u_5 >= 0.6 reject 2 and 10. The old 10 has left for the new 1; 11 and 12 hold their new MI."""
    from pbr.memory.base import TaskEnd
    from pbr.memory.walk import UncertaintyWalk

    mi = {10: 0.1, 11: 0.8, 12: 0.6, 1: 0.5, 2: 0.3}
    seed = 0
    u = torch.rand(5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    assert u[3] >= 0.75 and u[4] >= 0.6, u  # the draws this hand computation takes
    want = {"task": (([10, 11, 2], [0.9, 0.8, 0.3]), [[1, 2]]),
            "buffer_and_task": (([1, 11, 12], [0.5, 0.8, 0.6]), [[10, 11, 12, 1, 2]])}
    for pool, (held, calls) in want.items():
        buf = _stored(3, [10, 11, 12], [0.9, 0.8, 0.2])
        learner = _Rescorer(mi)
        walk = UncertaintyWalk(buf, torch.Generator().manual_seed(seed), learner, order="uncertain_first",
                               candidate="hold", evict="certain", pool=pool)
        walk.end_task(TaskEnd(learner, 1, _ids([1, 2]), torch.tensor([2, 2])))
        assert _held(buf) == held, pool
        assert learner.calls == calls, pool  # one scoring call: the buffer's samples with the task's
        assert walk.task_counts == [2] and walk.class_counts.tolist() == [0, 0, 2, 0]  # the stream: the task only


def test_walk_over_buffer_and_task_scores_both_with_the_model_just_fitted():
    """PBR with walk_pool buffer_and_task: after task 1 every stored score is what the model just
    fitted gives the buffer's and the task's samples scored together, in one call."""
    from pbr.uncertainty import score_images

    tasks = _uneven_tasks()
    m, ctx = _setup("pbr", walk_pool="buffer_and_task", evict="certain")
    _finish_tasks(m, tasks[:1])
    n = len(m.buffer)
    old = m.buffer.images[:n].clone()
    images, labels = tasks[1]
    m.begin_task(1, images, labels)
    fit_task(m, images, labels, 1, 8)
    state = ctx.generator.get_state()
    pool = torch.cat([old, images])
    want, _ = score_images(m.net, pool, m.opts.mc_samples, m.mi_temperature(), ctx.eval_batch_size, ctx.preprocess,
                           ctx.generator, classes=ctx.seen_classes(1))
    ctx.generator.set_state(state)
    m.end_task(1, images, labels)
    key = {bytes(x.numpy().tobytes()): s for x, s in zip(pool, want.tolist())}
    got = m.buffer.scores[: len(m.buffer)].tolist()
    assert [key[bytes(x.numpy().tobytes())] for x in m.buffer.images[: len(m.buffer)]] == pytest.approx(got)
    assert len(m.buffer) == n  # the buffer stays full


def test_a_stored_sample_evicted_earlier_in_the_walk_is_written_back_when_accepted():
    """Buffer of 2: samples 10, 11, re-scored 0.5, 0.3; the task's sample 1 at 0.9. Walk over the
    pool, most uncertain first (1, 10, 11), hold, evict certain, no offset: P = 2, 1, 2/3, and the
    seed's u_3 = 0.459 < 2/3 accepts all three. 1 evicts the lowest, 11 (slot 1); 10 is still in its
    slot: nothing written; 11 has left its slot, so it comes back over the lowest held, 10's 0.5."""
    from pbr.memory.base import TaskEnd
    from pbr.memory.walk import UncertaintyWalk

    u = torch.rand(3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert u[2] < 2 / 3, u  # the draw this hand computation takes
    buf = _stored(2, [10, 11], [0.9, 0.8])
    learner = _Rescorer({10: 0.5, 11: 0.3, 1: 0.9})
    walk = UncertaintyWalk(buf, torch.Generator().manual_seed(0), learner, order="uncertain_first",
                           candidate="hold", evict="certain", pool="buffer_and_task")
    walk.end_task(TaskEnd(learner, 1, _ids([1]), torch.tensor([2])))
    assert _held(buf) == ([11, 1], [0.3, 0.9])


def _end_tasks(walk, tasks):
    """End each task (its ids, their labels) on `walk`, its samples scored at random; returns the
    generator's state before the last task's walk."""
    from types import SimpleNamespace

    from pbr.memory.base import TaskEnd

    g = torch.Generator().manual_seed(0)
    learner = SimpleNamespace(memory_scores=lambda task, images, labels: torch.rand(labels.shape[0], generator=g))
    for t, (ids, labels) in enumerate(tasks):
        state = walk.generator.get_state()
        walk.end_task(TaskEnd(learner, t, _ids(ids), torch.tensor(labels)))
    return state


def test_the_class_offset_counts_only_the_classes_seen():
    """After task 0 (5 samples of class 0, 3 of class 1) of a 4-class head, the s_i of the offset are
    5 and 3: the classes not seen yet are no zero counts, whose softmax(-s) weights would take nearly
    all the weight and bring the offset to about 0 (P_1 = 16 / 1.09 instead of 16 / 4.24)."""
    from pbr.buffer import Buffer
    from pbr.memory.walk import UncertaintyWalk

    walk = UncertaintyWalk(Buffer(16, (3, 2, 2), 4), torch.Generator().manual_seed(0), offset="class")
    _end_tasks(walk, [(list(range(8)), [0] * 5 + [1] * 3)])
    assert walk.offset_counts().tolist() == [5.0, 3.0]


def _sequential_walk(held, ids, state, capacity, start, offset):
    """The walk in random order, advance, one sample at a time, from the documented draws (the
    permutation, u, the slots): the buffer's ids after it."""
    g = torch.Generator()
    g.set_state(state)
    n = len(ids)
    perm, u = torch.randperm(n, generator=g), torch.rand(n, dtype=torch.float64, generator=g)
    rand_slot = torch.randint(capacity, (n,), generator=g)
    held = list(held)
    for k in range(n):
        if u[k] < min(1.0, capacity / (start + k + 1 + offset)):
            if len(held) < capacity:
                held.append(ids[int(perm[k])])
            else:
                held[int(rand_slot[k])] = ids[int(perm[k])]
    return held


def test_walk_count_stream_counts_the_samples_of_earlier_tasks_in_n():
    """walk_count stream (Mammoth's num_seen_examples): the walk after task 1 counts N from the 4
    samples walked at task 0, P_N = 6 / (4 + N + 4) (per-task offset: s = [4]), not 6 / (N + 4)."""
    from pbr.buffer import Buffer
    from pbr.memory.walk import UncertaintyWalk

    walk = UncertaintyWalk(Buffer(6, (3, 2, 2), 4), torch.Generator().manual_seed(2), order="random",
                           count="stream", offset="task")
    first, second = [100, 101, 102, 103], list(range(20))
    state = _end_tasks(walk, [(first, [0] * 4), (second, [1] * 20)])
    stream = _sequential_walk(first, second, state, 6, start=4, offset=4.0)
    assert stream != _sequential_walk(first, second, state, 6, start=0, offset=4.0)  # the seed tells them apart
    assert _held(walk.buffer)[0] == stream


def test_mc_dropout_sets_the_scoring_rate_and_auto_is_the_trained_one():
    """auto scores at the head's trained rate (PBR: 0.1), so it equals mc_dropout 0.1 draw for draw;
    another rate changes the scores. A head trained without dropout (rate 0) gives T identical passes
    under auto, so every MI is exactly 0; mc_dropout 0.3 makes them differ."""
    images, labels = _task(0)

    def scores(rate, trained=None):
        m, ctx = _setup("pbr", mc_dropout=rate)
        if trained is not None:
            m.net.head.p = trained
        ctx.generator.manual_seed(11)
        return m.memory_scores(0, images, labels)

    assert _setup("pbr")[0].net.head.p == 0.1
    auto, same, other = scores("auto"), scores(0.1), scores(0.5)
    assert torch.equal(auto, same) and not torch.allclose(auto, other)
    assert torch.equal(scores("auto", trained=0.0), torch.zeros(24))
    assert (scores(0.3, trained=0.0) > 0).any()


def test_new_readings_name_their_rows_and_refuse_bad_values():
    from pbr.methods.pbr import PBR

    own = {"evict": "random", "walk_pool": "task", "mc_dropout": "auto", "mc_samples": "20"}
    for key, value, label in (("evict", "certain", "evict certain"),
                              ("walk_pool", "buffer_and_task", "walk over buffer and task"),
                              ("mc_dropout", "0.3", "MC dropout 0.3"), ("mc_samples", "50", "T 50")):
        assert PBR.variant_labels({**own, key: value}, own) == [label]
    check = {s.key: s.check for s in PBR.settings}
    assert check["mc_dropout"](0.3) and not check["mc_dropout"](1.0) and not check["mc_dropout"](0.0)


# --- mi_epochs: the MI averaged over the models at the ends of the task's last epochs -------------


def _recording(method):
    """Wraps end_epoch and memory_scores: a snapshot (net, generator state) at every scoring point,
    and the scores the walk got."""
    snaps, got = [], []
    end_epoch, memory_scores = method.end_epoch, method.memory_scores

    def at_epoch_end(epoch, epochs):
        snaps.append((epoch, copy.deepcopy(method.net), method.ctx.generator.get_state()))
        end_epoch(epoch, epochs)

    def scores(task, images, labels):
        snaps.append(("end", copy.deepcopy(method.net), method.ctx.generator.get_state()))
        got.append(memory_scores(task, images, labels))
        return got[-1]

    method.end_epoch, method.memory_scores = at_epoch_end, scores
    return snaps, got


def _mi_of(method, net, state, task, images):
    g = torch.Generator().manual_seed(123)
    g.set_state(state)
    mi, _ = score_images(net, images, method.opts.mc_samples, method.mi_temperature(), method.ctx.eval_batch_size,
                         method.ctx.preprocess, g, classes=method.ctx.seen_classes(task))
    return mi


def test_mi_epochs_two_is_the_mean_of_the_last_two_epochs_models():
    images, labels = _task(0)
    method, _ = _setup("pbr", mi_epochs=2)
    snaps, got = _recording(method)
    method.begin_task(0, images, labels)
    torch.manual_seed(0)  # the head's training dropout draws from the global generator
    fit_task(method, images, labels, 3, 8)
    method.end_task(0, images, labels)
    # Epoch ends 0, 1, 2, then the task's end; the model of epoch 1's end and the final one count.
    assert [s[0] for s in snaps] == [0, 1, 2, "end"]
    a = _mi_of(method, snaps[1][1], snaps[1][2], 0, images)
    b = _mi_of(method, snaps[3][1], snaps[3][2], 0, images)
    assert not torch.equal(a, b)  # the two models differ
    assert torch.equal(got[0], (a + b) / 2)
    # The earlier epoch's scoring gives its draws back: training is the same as under mi_epochs 1.
    once, _ = _setup("pbr")
    once.begin_task(0, images, labels)
    torch.manual_seed(0)
    fit_task(once, images, labels, 3, 8)
    assert all(torch.equal(p, q) for p, q in zip(method.net.parameters(), once.net.parameters()))


@pytest.mark.parametrize("k, calls", [(1, 2), (2, 4), (5, 6)])
def test_mi_epochs_scores_only_the_last_epochs_and_at_most_all(monkeypatch, k, calls):
    """Two tasks of 3 epochs: one scoring call a task by default (as before mi_epochs existed), k
    with mi_epochs k, the task's 3 epochs when k is larger."""
    import pbr.methods.pbr as pbr_module

    n = []
    real = pbr_module.score_images
    monkeypatch.setattr(pbr_module, "score_images", lambda *a, **kw: n.append(1) or real(*a, **kw))
    method, ctx = _setup("pbr", mi_epochs=k)
    _run_tasks(method, ctx, epochs=3)
    assert len(n) == calls


def test_mi_epochs_refuses_the_teacher_and_the_buffer_pool():
    from pbr.methods.pbr import PBR

    assert "mi_model" in PBR.refuse({"mi_epochs": 2, "mi_model": "teacher", "walk_pool": "task"})
    assert "walk_pool" in PBR.refuse({"mi_epochs": 3, "mi_model": "final", "walk_pool": "buffer_and_task"})
    assert PBR.refuse({"mi_epochs": 1, "mi_model": "teacher", "walk_pool": "buffer_and_task"}) is None


def test_a_head_without_dropout_is_refused_where_the_walk_orders_by_the_mi():
    """model.dropout 0 with mc_dropout auto: every MI 0, the walk's "uncertainty" order the data's
    (strict orders) or a uniform draw (weighted ones), while the score stage reported MI at 0.1."""
    import torch

    from pbr.errors import UserError
    from pbr.methods.pbr import PBR
    from stages.pipeline.train import settings
    from stages.runtime.config import from_dict

    base = {"sampling": "walk", "buffer_order": "uncertain_weighted", "mc_dropout": "auto", "dropout": 0.0}
    assert "model.dropout = 0" in PBR.refuse(base)
    for fine in ({"dropout": 0.1}, {"mc_dropout": 0.3}, {"buffer_order": "random"}, {"sampling": "reservoir"}):
        assert PBR.refuse({**base, **fine}) is None, fine
    with pytest.raises(UserError, match=r"^method.name = pbr: model.dropout = 0 leaves the walk's MC dropout"):
        settings(from_dict({"method": {"name": "pbr"}, "model": {"dropout": 0.0}}), torch.device("cpu"))


# --- mc_backbone: MC dropout on the backbone's last feature map too ------------------------------


def test_backbone_dropout_varies_the_feature_and_gives_mi_where_the_head_gives_none():
    net = Net(3, width=4, head="linear", dropout=0.0, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(0)
    # A map of ones [1, 2, 2, 1]: at p = 0.5 each kept element is 2, so a pooled entry is the mean
    # of two draws from {0, 2}: 0, 1 or 2, and a pass's feature differs from pass to pass.
    feats = mc_features(net, torch.ones(1, 2, 2, 1), 16, 0.5, g)
    assert feats.shape == (16, 1, 2)
    assert set(feats.flatten().tolist()) <= {0.0, 1.0, 2.0}
    assert len({tuple(f.flatten().tolist()) for f in feats}) > 1
    assert torch.equal(mc_features(net, torch.ones(1, 2, 2, 1), 4, 0.0, g), torch.ones(4, 1, 2))
    # Head dropout 0: one feature for every pass gives MI 0 (to rounding), a feature per pass does not.
    x = torch.randn(5, 32, generator=g) * 3
    fmap = torch.relu(x).reshape(5, 32, 1, 1).expand(5, 32, 2, 2).contiguous()
    head_only, _ = mutual_information(mc_probs(net, net.backbone.pool(fmap), 8, 1.0, g))
    with_backbone, _ = mutual_information(mc_probs(net, mc_features(net, fmap, 8, 0.5, g), 8, 1.0, g))
    assert head_only.abs().max() < 1e-6
    assert (with_backbone > 1e-3).all()


def test_mc_backbone_in_the_scorer_keeps_the_prediction_and_changes_the_mi():
    net = Net(4, width=4, head="cosine", dropout=0.1, generator=torch.Generator().manual_seed(1))
    images, _ = _task(0, n=10)
    args = (net, images, 6, 1.0, 4, lambda x: normalize(x, MEAN, STD))
    head_mi, _, head_pred = score_and_predict(*args, torch.Generator().manual_seed(2))
    both_mi, _, both_pred = score_and_predict(*args, torch.Generator().manual_seed(2), backbone=True)
    assert torch.equal(head_pred, both_pred)  # the prediction never drops anything
    assert not torch.allclose(head_mi, both_mi)
    # The default is the head-only scorer: the PBR setting left alone calls it as before.
    method, _ = _setup("pbr")
    assert method.opts.mc_backbone is False and method.opts.mi_epochs == 1


@pytest.mark.parametrize("head", ["cosine", "linear"])
@pytest.mark.parametrize("mi_logits", ["scaled", "cosine"])
def test_the_score_stage_scores_at_the_walks_temperature(head, mi_logits):
    """`pbr score`'s auto temperature (from the saved settings) is the one the walk scored with, for
    either head: tau1 = 0.1 on a linear head is 0.1, not 1."""
    from pbr.methods import METHODS, Context

    cls = METHODS["pbr"]
    opts, _ = cls.options("cifar10", 16, tau1=0.1, mi_logits=mi_logits)
    net = Net(4, 4, head, scale=10.0, dropout=0.1)
    ctx = Context(4, [torch.arange(0, 2), torch.arange(2, 4)], torch.device("cpu"), None, None, torch.Generator())
    walk = cls(net, ctx, opts).mi_temperature()
    assert walk == pytest.approx(1.0 if head == "cosine" and mi_logits == "cosine" else 0.1)
    assert cls.score_temperature({**vars(opts), "head": head, "scale": 10.0}) == pytest.approx(walk)


def test_pbrs_step_loss_by_hand():
    """Task 1 of 2 with a replay batch: CE over the stream and replay samples together at tau1, plus
    alpha x the KL at tau2 on the replay rows, plus beta x the sum (not of squares) of the old
    prototypes' shifts. The shifts are set to norms 0.5 and 0.25 (sum 0.75; squares would give
    0.3125); the other terms from the network's own logits with the rules written out here."""
    import torch.nn.functional as F

    method, _ = _setup("pbr", tau1=0.5, tau2=2.0, alpha=0.7, beta=3.0, kl_classes="old", replay_ce=True)
    method.task = 1
    net = method.net.eval()  # no dropout: the hand computation sees the same logits
    g = torch.Generator().manual_seed(5)
    x, bx = torch.randn(3, 3, 32, 32, generator=g), torch.randn(2, 3, 32, 32, generator=g)
    y, by = torch.tensor([2, 3, 2]), torch.tensor([0, 1])
    teacher = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    method.teacher = _Fixed(teacher)
    shift = torch.zeros_like(net.prototypes())
    shift[0, 0], shift[1, 1] = 0.5, 0.25
    method.old_prototypes = net.prototypes().detach() + shift
    method.has_replay = lambda: True
    method.replay = lambda: (bx, by, None)
    method.step = lambda loss: loss
    method.offer = lambda raw, labels: None
    loss = method.observe(x, y, None)

    with torch.no_grad():
        logits = net(torch.cat([x, bx]))
    ce = F.cross_entropy(logits / 0.5, torch.cat([y, by]))
    t_p = F.softmax(teacher[:, :2] / 2.0, 1)
    kl = (t_p * (t_p.log() - F.log_softmax(logits[3:, :2] / 2.0, 1))).sum(1).mean()
    want = ce + 0.7 * kl + 3.0 * 0.75
    assert math.isclose(loss.item(), want.item(), rel_tol=1e-5)


@pytest.mark.parametrize("case", ["first_task", "no_replay_ce", "beta_alone", "alpha_alone"])
def test_pbrs_step_loss_and_its_gradient_in_each_case(case):
    """The step's loss and its gradient against the rules written out (tau1 0.5, tau2 2, the old
    prototypes shifted by norms 0.5 and 0.25). First task, no replay yet: the CE at tau1 on the stream
    batch. replay_ce false: the CE on the stream rows only, still at tau1. beta without alpha: the
    prototype term is still added. alpha alone: the KL's gradient reaches the network through the
    student's replay logits (a detached student keeps the loss's value and takes the KL out of training)."""
    alpha, beta = {"first_task": (0.7, 3.0), "no_replay_ce": (0.7, 3.0), "beta_alone": (0.0, 3.0),
                   "alpha_alone": (0.7, 0.0)}[case]
    method, _ = _setup("pbr", tau1=0.5, tau2=2.0, alpha=alpha, beta=beta, kl_classes="old",
                       replay_ce=case != "no_replay_ce")
    replay = case != "first_task"
    method.task = 1 if replay else 0
    net = method.net.eval()  # no dropout: the hand computation sees the same logits
    g = torch.Generator().manual_seed(5)
    x, bx = torch.randn(3, 3, 32, 32, generator=g), torch.randn(2, 3, 32, 32, generator=g)
    y, by = torch.tensor([2, 3, 2]), torch.tensor([0, 1])
    teacher = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    if replay:
        method.teacher = _Fixed(teacher)
        shift = torch.zeros_like(net.prototypes())
        shift[0, 0], shift[1, 1] = 0.5, 0.25
        method.old_prototypes = net.prototypes().detach() + shift
    method.has_replay = lambda: replay
    method.replay = lambda: (bx, by, None)
    method.step = lambda loss: loss
    method.offer = lambda raw, labels: None
    params = list(net.parameters())
    loss = method.observe(x, y, None)
    got = torch.autograd.grad(loss, params)

    if not replay:
        want = F.cross_entropy(net(x) / 0.5, y)
    else:
        logits = net(torch.cat([x, bx]))
        if case == "no_replay_ce":
            ce = F.cross_entropy(logits[:3] / 0.5, y)
        else:
            ce = F.cross_entropy(logits / 0.5, torch.cat([y, by]))
        t_p = F.softmax(teacher[:, :2] / 2.0, 1)
        kl = (t_p * (t_p.log() - F.log_softmax(logits[3:, :2] / 2.0, 1))).sum(1).mean()
        shifts = (net.prototypes()[:2] - method.old_prototypes[:2]).norm(dim=1).sum()
        assert math.isclose(shifts.item(), 0.75, rel_tol=1e-5)
        want = ce + alpha * kl + beta * shifts
    assert math.isclose(loss.item(), want.item(), rel_tol=1e-5), case
    for mine, theirs in zip(got, torch.autograd.grad(want, params)):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-7)


def test_imprinting_a_linear_head_scales_to_the_old_norm_and_takes_the_old_mean_bias():
    """On a linear head the norm is not normalised away: a new class's vector points at its samples'
    mean normalised feature with the old classes' mean norm, and its bias is the old biases' mean."""
    from pbr.methods.pbr import imprint_weights

    net = Net(4, width=4, head="linear", dropout=0.1, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        net.head.weight[0].mul_(3.0)  # old norms far apart, so their mean is no accident
        net.head.bias[:2] = torch.tensor([0.4, -0.1])
    old_norm = net.head.weight[:2].norm(dim=1).mean().item()
    images, labels = _task(1)
    preprocess = lambda x: normalize(x, MEAN, STD)  # noqa: E731
    imprint_weights(net, images, labels, torch.tensor([2, 3]), torch.tensor([0, 1]), preprocess, 8)
    with torch.no_grad():
        f = F.normalize(net.eval().features(preprocess(images)), dim=1)
    for c in (2, 3):
        w = net.head.weight[c].detach()
        assert math.isclose(w.norm().item(), old_norm, rel_tol=1e-5), c
        assert F.cosine_similarity(w, f[labels == c].mean(0), dim=0).item() > 0.9999, c
        assert math.isclose(net.head.bias[c].item(), 0.15, rel_tol=1e-5), c
