import math

import pytest
import torch

from pbr.models import Net
from pbr.uncertainty import mc_features, mc_probs, mutual_information, predictive_entropy, score_and_predict, score_images


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _h(*p: float) -> float:
    return -sum(q * math.log(q) for q in p if q > 0)


def test_mutual_information_by_hand():
    # Two masks (T=2), three samples, two classes.
    probs = torch.tensor(
        [
            [[0.9, 0.1], [1.0, 0.0], [0.7, 0.3]],
            [[0.3, 0.7], [0.0, 1.0], [0.7, 0.3]],
        ],
        dtype=torch.float64,
    )
    mi, ent = mutual_information(probs)
    # sample 0: mean (0.6, 0.4)
    h0 = -(0.6 * math.log(0.6) + 0.4 * math.log(0.4))
    e0 = 0.5 * (-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)) - (0.3 * math.log(0.3) + 0.7 * math.log(0.7)))
    # sample 1: one-hot disagreeing masks: H[mean] = log 2, each H[p_t] = 0 (0 log 0 = 0)
    # sample 2: identical masks: MI = 0
    h2 = -(0.7 * math.log(0.7) + 0.3 * math.log(0.3))
    torch.testing.assert_close(ent, torch.tensor([h0, math.log(2), h2], dtype=torch.float64))
    torch.testing.assert_close(mi, torch.tensor([h0 - e0, math.log(2), 0.0], dtype=torch.float64))
    assert abs((h0 - e0) - 0.20503803) < 1e-7  # written-out value of the first row
    torch.testing.assert_close(predictive_entropy(probs[0]), torch.tensor([_h(0.9, 0.1), 0.0, h2], dtype=torch.float64))


def test_mi_of_identical_passes_is_zero_never_below():
    """T identical passes have MI 0 (Jensen's gap is 0); in float32 H(mean p) - mean H(p) rounds
    below 0 for a good share of rows (about a tenth to a third of these), which must not read as
    more certain than certain. Uniform rows, the old test's, round to 0 exactly either way."""
    p = torch.softmax(torch.randn(1000, 10, generator=_gen(3)), dim=1).expand(5, 1000, 10).contiguous()
    mi, h = mutual_information(p)
    assert (mi >= 0).all() and mi.max() < 1e-6 and torch.isfinite(h).all()


def test_zero_dropout_gives_zero_mi():
    net = Net(5, width=4, dropout=0.0).eval()
    feats = torch.randn(6, 32, generator=_gen(1))
    probs = mc_probs(net, feats, T=8, tau=0.1, generator=_gen(2))
    assert probs.shape == (8, 6, 5)
    mi, _ = mutual_information(probs)
    torch.testing.assert_close(mi, torch.zeros(6), atol=1e-6, rtol=0)


def test_masks_differ_and_match_nn_dropout_semantics():
    p = 0.5
    net = Net(5, width=4, dropout=p).eval()
    feats = torch.randn(6, 32, generator=_gen(3))
    T, tau = 4, 0.1
    probs = mc_probs(net, feats, T, tau, generator=_gen(4))
    for t in range(1, T):
        assert not torch.allclose(probs[0], probs[t])
    # Same draws by hand: keep iff U >= p, scaled by 1 / (1 - p), one [T, B, D] draw.
    keep = torch.rand((T, 6, 32), generator=_gen(4)) >= p
    z = torch.nn.functional.normalize(feats, dim=1) * keep / (1 - p)
    logits = net.head.scale * z @ net.prototypes().T
    torch.testing.assert_close(probs, torch.softmax(logits / tau, dim=-1))
    assert abs(keep.float().mean().item() - (1 - p)) < 0.05


def test_reproducible_with_same_seed():
    net = Net(5, width=4, dropout=0.3).eval()
    feats = torch.randn(6, 32, generator=_gen(5))
    a = mc_probs(net, feats, 5, 0.1, generator=_gen(6))
    b = mc_probs(net, feats, 5, 0.1, generator=_gen(6))
    c = mc_probs(net, feats, 5, 0.1, generator=_gen(7))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_classes_restrict_the_softmax():
    net = Net(6, width=4, dropout=0.0).eval()
    feats = torch.randn(3, 32, generator=_gen(8))
    classes = torch.tensor([0, 2, 3])
    probs = mc_probs(net, feats, 2, 0.5, generator=_gen(9), classes=classes)
    assert probs.shape == (2, 3, 3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3))
    expected = torch.softmax(net.classify(feats)[:, classes] / 0.5, dim=-1)
    torch.testing.assert_close(probs[0], expected)


@pytest.mark.parametrize("start_training", [True, False])
def test_score_images(start_training):
    net = Net(4, width=4, dropout=0.3, generator=_gen(10))
    net.train(start_training)
    images = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8, generator=_gen(11))
    preprocess = lambda x: x.float() / 255.0  # noqa: E731
    bn_mean = net.backbone.bn1.running_mean.clone()
    mi, ent = score_images(net, images, T=3, tau=0.1, batch_size=4, preprocess=preprocess, generator=_gen(12))
    assert mi.shape == ent.shape == (10,)
    assert net.training == start_training
    assert torch.equal(net.backbone.bn1.running_mean, bn_mean)  # backbone ran in eval mode
    assert not mi.is_inference()
    # Same thing by hand, batch by batch, same generator stream.
    net.eval()
    g = _gen(12)
    ref = []
    with torch.no_grad():
        for s in range(0, 10, 4):
            ref.append(mutual_information(mc_probs(net, net.features(preprocess(images[s : s + 4])), 3, 0.1, g))[0])
    torch.testing.assert_close(mi, torch.cat(ref))


def test_backbone_dropout_drops_a_share_p_and_keeps_the_mean():
    """mc_features at p = 0.25 on a 1 x 1 map of ones (the pooled feature is the element itself):
    as nn.Dropout, a quarter of the entries are 0 and the rest 1 / 0.75, so the mean stays 1. (The
    readings test runs p = 0.5 only, where keeping with probability p or 1 - p looks the same.)"""
    net = Net(3, width=4, head="linear", dropout=0.0)
    feats = mc_features(net, torch.ones(4, 256, 1, 1), 8, 0.25, _gen(15))
    assert feats.shape == (8, 4, 256)
    assert feats.unique().tolist() == [0.0, pytest.approx(1 / 0.75)]
    assert abs((feats == 0).float().mean().item() - 0.25) < 0.03  # 8192 draws: sd 0.005
    assert abs(feats.mean().item() - 1.0) < 0.03


def test_the_prediction_over_some_classes_is_an_original_class_index():
    """classes [1, 3] (the seen classes of a shuffled stream are not 0..k-1): the prediction is class
    1 or 3, the one of the two with the larger logit, never a position 0 or 1 within `classes`."""
    net = Net(4, width=4, dropout=0.2, generator=_gen(16))
    images = torch.randint(0, 256, (12, 3, 32, 32), dtype=torch.uint8, generator=_gen(17))
    preprocess = lambda x: x.float() / 255.0  # noqa: E731
    _, _, pred = score_and_predict(net, images, 2, 1.0, 5, preprocess, _gen(18), classes=torch.tensor([1, 3]))
    with torch.no_grad():
        logits = net.eval()(preprocess(images))
    other = torch.where(pred == 1, 3, 1)
    assert set(pred.tolist()) <= {1, 3}
    assert (logits.gather(1, pred[:, None]) >= logits.gather(1, other[:, None])).all()


def test_bad_arguments():
    net = Net(4, width=4)
    feats = torch.randn(2, 32)
    with pytest.raises(ValueError):
        mc_probs(net, feats, 0, 0.1, _gen())
    with pytest.raises(ValueError):
        mc_probs(net, feats, 2, 0.0, _gen())
    with pytest.raises(ValueError):
        mutual_information(torch.rand(2, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_score_images_from_host_images():
    net = Net(4, width=4, dropout=0.3, generator=_gen(13)).cuda()
    images = torch.randint(0, 256, (9, 3, 32, 32), dtype=torch.uint8, generator=_gen(14))
    run = lambda seed: score_images(  # noqa: E731
        net, images, 4, 0.1, 4, lambda x: x.float() / 255.0, torch.Generator(device="cuda").manual_seed(seed), torch.tensor([0, 1])
    )
    (mi, ent), (mi2, _) = run(1), run(1)
    assert mi.device.type == "cuda" and mi.shape == ent.shape == (9,)
    assert torch.equal(mi, mi2)
    with pytest.raises(ValueError):
        score_images(net, images, 4, 0.1, 4, lambda x: x.float(), _gen(1))


def test_the_score_stage_summaries_by_hand(tmp_path, monkeypatch):
    """The forgotten rate is taken among the samples learned right after their task, per class as
    overall (per class it was over every sample, which reads a tail class never learned as never
    forgotten); an empty group's MI or rate is NaN, not 0 (a made-up "certain")."""
    import csv

    import numpy as np

    from stages.pipeline import score

    monkeypatch.chdir(tmp_path)
    t, f = True, False
    data = {"split": np.array(["train"] * 6 + ["test"]), "label": np.array([0, 0, 0, 0, 1, 1, 0]),
            "task": np.array([0, 0, 0, 0, 0, 0, 0]), "mi": np.array([0.4, 0.1, 0.3, 0.9, 0.2, 0.6, 5.0]),
            "entropy": np.zeros(7), "correct_own": np.array([t, t, t, f, f, f, t]),
            "forgotten": np.array([t, f, f, f, f, f, t]), "mi_final": np.array([0.2, 0.2, 0.1, 0.3, 0.0, 0.4, 9.0])}
    manifest = {"train_counts": [4, 2], "class_order": [0, 1], "class_names": ["a", "b"], "n_tasks": 2}
    s = score._summaries(data, manifest)
    # class 0: three learned, one of them forgotten; class 1: none learned
    rows = list(csv.DictReader((tmp_path / "reports/score/by_class.csv").open()))
    assert float(rows[0]["forgotten_rate"]) == pytest.approx(1 / 3) and math.isnan(float(rows[1]["forgotten_rate"]))
    assert float(rows[0]["mean_mi"]) == pytest.approx((0.4 + 0.1 + 0.3 + 0.9) / 4)
    assert float(rows[0]["mean_mi_final"]) == pytest.approx(0.2) and float(rows[1]["mean_mi_final"]) == pytest.approx(0.2)
    assert s["score.forgotten_rate"] == pytest.approx(1 / 3)
    assert s["score.mi_forgotten"] == pytest.approx(0.4) and s["score.mi_kept"] == pytest.approx(0.2)
    assert s["score.mean_mi"] == pytest.approx(2.5 / 6)  # the test sample's 5.0 is no training sample
    data["forgotten"][:] = False
    s = score._summaries(data, manifest)
    assert math.isnan(s["score.mi_forgotten"]) and s["score.forgotten_rate"] == 0
    data["correct_own"][:] = False
    s = score._summaries(data, manifest)
    assert math.isnan(s["score.forgotten_rate"]) and math.isnan(s["score.mi_kept"])


def test_the_last_tasks_samples_are_neither_forgotten_nor_kept(tmp_path, monkeypatch):
    """The last task's own model is the final model: its samples cannot be forgotten, so they count
    in neither group (counted as kept, the tail's MI pulled the kept mean up and the rate down)."""
    import csv

    import numpy as np

    from stages.pipeline import score

    monkeypatch.chdir(tmp_path)
    t, f = True, False
    # task 0 (class 0): four learned, two forgotten; task 1 (class 1, the last): four learned
    data = {"split": np.array(["train"] * 8), "label": np.array([0, 0, 0, 0, 1, 1, 1, 1]),
            "task": np.array([0, 0, 0, 0, 1, 1, 1, 1]),
            "mi": np.array([0.5, 0.5, 0.1, 0.1, 0.9, 0.9, 0.9, 0.9]), "entropy": np.zeros(8),
            "correct_own": np.full(8, True), "forgotten": np.array([t, t, f, f, f, f, f, f]), "mi_final": np.zeros(8)}
    manifest = {"train_counts": [4, 4], "class_order": [0, 1], "class_names": ["a", "b"], "n_tasks": 2}
    s = score._summaries(data, manifest)
    assert s["score.forgotten_rate"] == pytest.approx(0.5)  # 2 of task 0's 4, not 2 of 8
    assert s["score.mi_forgotten"] == pytest.approx(0.5) and s["score.mi_kept"] == pytest.approx(0.1)
    rows = list(csv.DictReader((tmp_path / "reports/score/by_class.csv").open()))
    assert float(rows[0]["forgotten_rate"]) == pytest.approx(0.5) and math.isnan(float(rows[1]["forgotten_rate"]))
