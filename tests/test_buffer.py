import io
import math

import pytest
import torch

from pbr.buffer import Buffer
from pbr.memory.reservoir import Reservoir
from pbr.memory.walk import UncertaintyWalk
from pbr.selection import sample_in_probability, walk_order

SHAPE = (1, 2, 2)  # tiny images keep the statistical tests fast


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batch(ids: torch.Tensor, task: int = 0, n_classes: int = 3):
    """Images, labels, tasks, logits that all encode the stream id, to check rows stay together."""
    b = ids.numel()
    images = (ids % 256).to(torch.uint8).reshape(b, 1, 1, 1).expand(b, *SHAPE).contiguous()
    logits = ids.float().unsqueeze(1).expand(b, n_classes).contiguous()
    return images, ids.clone(), torch.full((b,), task), logits


def _reservoir_reference(cap: int, batches: list[torch.Tensor], seed: int, device: str = "cpu") -> dict[int, int]:
    """Plain per-sample Mammoth reservoir fed the same draws: slot -> stream id."""
    g = torch.Generator(device=device).manual_seed(seed)
    slots: dict[int, int] = {}
    seen, collided = 0, False
    for ids in batches:
        u = torch.rand(ids.numel(), dtype=torch.float64, generator=g, device=device).cpu()
        written = set()
        for k, sid in enumerate(ids.tolist()):
            j = seen if seen < cap else int(math.floor(u[k].item() * (seen + 1)))
            if j < cap:
                collided |= j in written
                written.add(j)
                slots[j] = sid
            seen += 1
    assert collided, "the test stream should overwrite a slot twice within one batch"
    return slots


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_reservoir_matches_sequential_rule(device):
    cap = 5
    ids = torch.arange(400)
    batches = list(torch.split(ids, [3, 7, 64, 1, 100, 25, 200]))
    buf = Buffer(cap, SHAPE, n_classes=3, device=device)
    g = torch.Generator(device=device).manual_seed(11)
    memory = Reservoir(buf, g)
    for b in batches:
        memory.offer(*_batch(b))
        assert buf.size <= cap
    ref = _reservoir_reference(cap, batches, 11, device)
    expected = torch.tensor([ref[j] for j in range(cap)], device=device)
    assert torch.equal(buf.labels, expected)
    assert torch.equal(buf.logits[:, 0], expected.float())
    assert torch.equal(buf.images[:, 0, 0, 0], (expected % 256).to(torch.uint8))
    assert memory.seen == 400 and buf.size == cap


def test_reservoir_inclusion_is_uniform():
    cap, stream, reps = 50, 500, 600
    g = _gen(1)
    counts = torch.zeros(stream)
    for _ in range(reps):
        buf = Buffer(cap, SHAPE, n_classes=3)
        memory = Reservoir(buf, g)
        for ids in torch.split(torch.arange(stream), 32):
            memory.offer(*_batch(ids))
            assert buf.size == min(cap, memory.seen)
        counts += torch.bincount(buf.labels, minlength=stream)
    q = cap / stream
    freq = counts / reps
    assert (freq - q).abs().max() < 0.06  # ~5 sigma per item
    chi2 = ((counts - reps * q) ** 2 / (reps * q * (1 - q))).sum()
    assert chi2 < 499 + 5 * math.sqrt(2 * 499)
    assert abs(freq[:50].mean() - q) < 0.015 and abs(freq[-50:].mean() - q) < 0.015


def test_sample_and_get():
    buf = Buffer(20, SHAPE, n_classes=3)
    g = _gen(2)
    Reservoir(buf, g).offer(*_batch(torch.arange(7)))
    idx = buf.sample(32, g)
    assert idx.numel() == 7 and idx.unique().numel() == 7 and int(idx.max()) < 7
    images, labels, tasks, logits = buf.get(idx)
    assert torch.equal(labels, idx) and torch.equal(logits[:, 0], idx.float()) and images.dtype == torch.uint8
    assert buf.sample(3, g).numel() == 3
    # uniform over the filled slots
    hits = torch.bincount(torch.cat([buf.sample(2, g) for _ in range(3500)]), minlength=7) / 7000
    assert (hits - 1 / 7).abs().max() < 0.02


def test_sample_in_probability_by_hand():
    cap = 10
    z = math.exp(-3) + math.exp(-1)
    offset = 3 * math.exp(-3) / z + 1 * math.exp(-1) / z  # counts [3, 1]: w = softmax([-3, -1])
    p = sample_in_probability(4, torch.tensor([3.0, 1.0]), cap)
    torch.testing.assert_close(p, torch.tensor([cap / (n + offset) for n in (1, 2, 3, 4)], dtype=torch.float64))
    # first task: empty sum
    torch.testing.assert_close(sample_in_probability(3, torch.tensor([]), cap), torch.tensor([10.0, 5.0, 10 / 3], dtype=torch.float64))
    # huge counts stay finite (stable softmax); the weight sits on the rarest class
    p = sample_in_probability(2, torch.tensor([5000.0, 2997.0, 4000.0]), 200)
    torch.testing.assert_close(p, torch.tensor([200 / 2998, 200 / 2999], dtype=torch.float64))


def _walk(buf, n, scores, counts, g, order="uncertain_first", task=1, offset=0, candidate="advance"):
    images, labels, tasks, _ = _batch(torch.arange(offset, offset + n), task)
    return UncertaintyWalk(buf, g, order=order, candidate=candidate).walk(images, labels, tasks, scores,
                                                                          torch.tensor(counts))


def test_walk_acceptance_frequency_matches_min_1_p():
    cap, n, reps, counts = 5, 20, 1500, [3.0, 1.0]
    g = _gen(3)
    scores = -torch.arange(n, dtype=torch.float32)  # desc order = input order = walk order
    freq = torch.zeros(n)
    for _ in range(reps):
        buf = Buffer(cap, SHAPE, n_classes=3)
        freq += _walk(buf, n, scores, counts, g).float()
    expected = sample_in_probability(n, torch.tensor(counts), cap).clamp(max=1).float()
    assert (freq / reps - expected).abs().max() < 0.045  # ~3.5 sigma at p = 0.5
    assert torch.equal(freq[expected == 1], torch.full_like(freq[expected == 1], reps))


def test_walk_matches_sequential_rule():
    cap, n, counts = 6, 40, [2.0, 4.0]
    g = _gen(4)
    buf = Buffer(cap, SHAPE, n_classes=3)
    Reservoir(buf, g).offer(*_batch(torch.arange(100, 103), task=0))  # 3 slots free
    scores = torch.rand(n, generator=_gen(5))
    state = g.get_state()
    _walk(buf, n, scores, counts, g, order="random")
    # Reference: same draws in the documented order, one sample at a time.
    ref_g = torch.Generator()
    ref_g.set_state(state)
    perm = torch.randperm(n, generator=ref_g)
    u = torch.rand(n, dtype=torch.float64, generator=ref_g)
    rand_slot = torch.randint(cap, (n,), generator=ref_g)
    p = sample_in_probability(n, torch.tensor(counts), cap)
    slots = {j: 100 + j for j in range(3)}
    size = 3
    for k in range(n):
        if u[k] < min(1.0, p[k].item()):
            if size < cap:
                slots[size], size = int(perm[k]), size + 1
            else:
                slots[int(rand_slot[k])] = int(perm[k])
    assert buf.size == size == cap
    assert buf.labels.tolist() == [slots[j] for j in range(cap)]
    task_rows = buf.tasks == 1
    torch.testing.assert_close(buf.scores[task_rows], scores[buf.labels[task_rows]])


def test_first_task_fitting_in_buffer_is_stored_whole():
    buf = Buffer(50, SHAPE, n_classes=3)
    scores = torch.rand(30, generator=_gen(6))
    accepted = _walk(buf, 30, scores, [], _gen(7), task=0)
    assert accepted.all() and buf.size == 30
    assert sorted(buf.labels[:30].tolist()) == list(range(30))
    # stored in walk order: most uncertain first
    torch.testing.assert_close(buf.scores[:30], scores.sort(descending=True).values)


def _stored_task_mean(order, prefill, counts, reps=60, n=500, cap=50, seed=8, candidate="advance"):
    g = _gen(seed)
    means, task_means = [], []
    for _ in range(reps):
        buf = Buffer(cap, SHAPE, n_classes=3)
        if prefill:
            Reservoir(buf, g).offer(*_batch(torch.arange(10_000, 10_000 + prefill), task=0))
        scores = torch.rand(n, generator=g)
        _walk(buf, n, scores, counts, g, order=order, candidate=candidate)
        mine = buf.tasks[: buf.size] == 1
        means.append(buf.scores[: buf.size][mine].mean())
        task_means.append(scores.mean())
    return float(torch.stack(means).mean()), float(torch.stack(task_means).mean())


def test_walk_prefers_uncertain_samples_while_the_buffer_has_room():
    # P_N = 50 / (N + 500) < 1 throughout and ~35 acceptances < 50 free slots: nothing is
    # evicted, so the front of the walk (acceptance twice the tail's) decides the content.
    desc, task = _stored_task_mean("uncertain_first", 0, [500.0, 500.0])
    asc, _ = _stored_task_mean("certain_first", 0, [500.0, 500.0])
    rnd, _ = _stored_task_mean("random", 0, [500.0, 500.0])
    assert desc > task + 0.03
    assert asc < task - 0.03
    assert abs(rnd - task) < 0.02


def test_walk_is_order_free_once_the_buffer_is_full():
    # With a full buffer and P < 1 the walk is a reservoir over the task: each step is kept
    # with probability capacity / (n + offset) whatever its position, so the MI order has no
    # effect on what survives (the "advance" reading, docs/method.md).
    desc, task = _stored_task_mean("uncertain_first", 50, [100.0, 100.0])
    rnd, _ = _stored_task_mean("random", 50, [100.0, 100.0])
    assert abs(desc - task) < 0.03 and abs(rnd - task) < 0.03


def test_held_candidate_stores_the_most_uncertain_even_when_full():
    # The paper's text: a rejected candidate stays the candidate, so the task's share of the
    # buffer is its top-k by MI (then thinned by uniform sample-out), not a uniform subset.
    desc, task = _stored_task_mean("uncertain_first", 50, [100.0, 100.0], candidate="hold")
    asc, _ = _stored_task_mean("certain_first", 50, [100.0, 100.0], candidate="hold")
    rnd, _ = _stored_task_mean("random", 50, [100.0, 100.0], candidate="hold")
    assert desc > 0.85 and asc < 0.15 and abs(rnd - task) < 0.03


def test_held_candidate_accepts_as_often_as_advance():
    n, counts, cap = 300, [40.0, 60.0], 20
    p = sample_in_probability(n, torch.tensor(counts), cap).clamp(max=1)
    stored = []
    g = _gen(12)
    for _ in range(200):
        buf = Buffer(cap, SHAPE, n_classes=3)
        Reservoir(buf, g).offer(*_batch(torch.arange(10_000, 10_000 + cap), task=0))
        accepted = _walk(buf, n, torch.rand(n, generator=g), counts, g, candidate="hold")
        stored.append(accepted.sum())
    # Each step's acceptance is Bernoulli(min(1, P_N)); the count is their sum.
    assert abs(float(torch.stack(stored).float().mean()) - float(p.sum())) < 1.7  # 4 sigma


def test_state_dict_round_trip_resumes_exactly():
    g = _gen(9)
    buf = Buffer(8, SHAPE, n_classes=3)
    memory = Reservoir(buf, g)
    memory.offer(*_batch(torch.arange(13)))
    _walk(buf, 10, torch.rand(10, generator=_gen(10)), [4.0, 9.0], g, offset=500)
    blob = io.BytesIO()
    torch.save(memory.state_dict(), blob)
    blob.seek(0)
    g2 = torch.Generator()
    g2.set_state(g.get_state())
    other = Reservoir(Buffer(8, SHAPE, n_classes=3), g2)
    other.load_state_dict(torch.load(blob))
    assert (other.buffer.size, other.seen) == (buf.size, memory.seen) == (8, 13)
    for name in ("images", "labels", "tasks", "logits", "scores"):
        assert torch.equal(getattr(other.buffer, name), getattr(buf, name))
    memory.offer(*_batch(torch.arange(20, 40)))
    other.offer(*_batch(torch.arange(20, 40)))
    assert torch.equal(other.buffer.labels, buf.labels) and other.seen == memory.seen == 33
    with pytest.raises(ValueError):
        Buffer(9, SHAPE, n_classes=3).load_state_dict(buf.state_dict())


def test_bad_arguments():
    with pytest.raises(ValueError):
        Buffer(0, SHAPE, n_classes=3)
    with pytest.raises(ValueError):
        Buffer(5, SHAPE)
    buf = Buffer(5, SHAPE, n_classes=3)
    images, labels, tasks, logits = _batch(torch.arange(4))
    with pytest.raises(ValueError):
        Reservoir(buf, _gen()).offer(images.float(), labels, tasks)
    with pytest.raises(ValueError):
        Reservoir(buf, _gen()).offer(images, labels, tasks, logits[:, :2])
    with pytest.raises(ValueError):
        Reservoir(buf, None).offer(images, labels, tasks)
    with pytest.raises(ValueError):
        UncertaintyWalk(buf, _gen(), order="max").walk(images, labels, tasks, torch.rand(4), torch.tensor([]))


@CUDA
def test_cuda_walk_with_host_images_and_deterministic_mode():
    torch.use_deterministic_algorithms(True)
    try:
        g = torch.Generator(device="cuda").manual_seed(12)
        buf = Buffer(16, SHAPE, n_classes=3, device="cuda")
        Reservoir(buf, g).offer(*[t.cuda() for t in _batch(torch.arange(40), task=0)])
        images, labels, tasks, logits = _batch(torch.arange(1000, 1200), task=1)  # task data on the host
        scores = torch.rand(200, generator=_gen(13)).cuda()
        accepted = UncertaintyWalk(buf, g).walk(images, labels, tasks, scores, torch.tensor([20.0, 20.0]), logits=logits)
        assert accepted.device.type == "cuda" and buf.size == 16
        mine = buf.tasks == 1
        assert bool(mine.any())
        assert torch.equal(buf.scores[mine], scores[buf.labels[mine] - 1000])
        assert torch.equal(buf.logits[mine, 0], buf.labels[mine].float())
        assert buf.sample(8, g).device.type == "cuda"
    finally:
        torch.use_deterministic_algorithms(False)


def test_weighted_order_puts_a_sample_first_with_odds_of_its_weight():
    """A-Res keys: of two samples with weights 3 and 1, the first leads 3 times in 4."""

    g = torch.Generator().manual_seed(0)
    scores = torch.tensor([3.0, 1.0])
    first = sum(int(walk_order(scores, "uncertain_weighted", g)[0] == 0) for _ in range(4000)) / 4000
    assert abs(first - 0.75) < 0.025, first  # binomial sd 0.007
    # With three samples, the one of weight 0 comes last every time.
    scores = torch.tensor([0.0, 2.0, 1.0])
    assert all(walk_order(scores, "uncertain_weighted", g)[-1] == 0 for _ in range(200))


def test_strict_orders_rank_by_score_and_spread_their_ties_over_the_task():
    """Distinct scores: exactly the sort by score. Tied ones (an MI of 0 for every sample of a head
    without dropout, or saturated samples) came in data order, which on TinyImageNet is class by class:
    a walk keeping the first 20 of 4 classes x 50 kept classes 0 and 1 only."""
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(200, generator=g)
    assert walk_order(scores, "certain_first", g).tolist() == sorted(range(200), key=lambda i: scores[i].item())
    assert walk_order(scores, "uncertain_first", g).tolist() == sorted(range(200), key=lambda i: -scores[i].item())
    state = g.get_state()
    labels = torch.arange(200) // 50  # class-grouped, as TinyImageNet's raw order
    for order in ("certain_first", "uncertain_first"):
        first = walk_order(torch.zeros(200), order, g)[:20]
        assert labels[first].bincount(minlength=4).min() >= 4, labels[first].bincount(minlength=4)
        # One tied group among ranked samples: it keeps its place in the order.
        tied = torch.tensor([0.5] * 10 + [0.1, 0.9])
        assert set(walk_order(tied, order, g)[1:11].tolist()) == set(range(10))
    assert torch.equal(g.get_state(), state)  # no draw: a walk's other random choices are as before


def test_write_is_the_public_way_in_later_rows_win_and_targets_past_the_end_drop():
    """The storage API a new policy (herding, per-task memories) writes through."""
    buf = Buffer(4, (3, 2, 2), n_classes=3)
    images = torch.arange(5, dtype=torch.uint8).view(5, 1, 1, 1).expand(5, 3, 2, 2).contiguous()
    labels = torch.tensor([0, 1, 2, 0, 1])
    buf.write(torch.tensor([1, 1, 4, 9, 0]), images, labels, torch.zeros(5, dtype=torch.int64),
              scores=torch.tensor([0.5, 0.6, 0.7, 0.8, 0.9]))
    assert buf.size == 0  # the policy sets how many slots are filled
    assert buf.images[1, 0, 0, 0].item() == 1 and buf.labels[1].item() == 1  # row 1 came after row 0
    assert buf.images[0, 0, 0, 0].item() == 4 and buf.scores[0].item() == pytest.approx(0.9)
    assert buf.labels[2:].tolist() == [0, 0] and buf.images[2:].sum().item() == 0  # rows 2, 3 dropped


def test_a_write_without_logits_or_scores_leaves_zeros_not_the_previous_occupants():
    """Slot 0 held a sample with logits 7 and score 0.9; a policy that keeps neither (reservoir
    without DER's logits) writes over it: the new sample must not inherit them (a DER replay or an
    evict-by-score would read the old sample's values as the new one's)."""
    buf = Buffer(2, SHAPE, n_classes=3)
    images, labels, tasks, logits = _batch(torch.tensor([7, 8]))
    buf.write(torch.tensor([0, 1]), images, labels, tasks, logits, scores=torch.tensor([0.9, 0.8]))
    images, labels, tasks, _ = _batch(torch.tensor([5]))
    buf.write(torch.tensor([0]), images, labels, tasks)
    assert buf.labels.tolist() == [5, 8]
    assert buf.logits.tolist() == [[0.0, 0.0, 0.0], [8.0, 8.0, 8.0]]
    assert buf.scores.tolist() == pytest.approx([0.0, 0.8])


def test_a_batch_whose_tasks_do_not_match_is_a_one_line_error():
    buf = Buffer(4, SHAPE, n_classes=3)
    images, labels, tasks, _ = _batch(torch.arange(3))
    with pytest.raises(ValueError, match=r"^labels and tasks must be \[3\], got \(3,\) and \(2,\)$"):
        buf.write(torch.arange(3), images, labels, tasks[:2])
