"""What the stages' PNGs draw, read off the figures before they are saved (stages/runtime/plots.py)."""

import math

import pytest

from stages.runtime import plots


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plots module would save, kept open to read."""
    figs = []
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path: figs.append(fig))
    return figs


def test_a_task_not_learned_yet_is_grey_not_a_number(drawn, tmp_path):
    """Above the diagonal Class-IL is 0 by its mask and Task-IL is chance on untrained classes: both
    were coloured and numbered as if measured. A NaN row (JOINT's before the last) is grey too."""
    m = [[80.0, 99.0, 99.0], [60.0, 70.0, 99.0], [50.0, 55.0, 65.0]]
    plots.heatmaps({"Task-IL": m, "JOINT": [[math.nan] * 3, [math.nan] * 3, [40.0, 45.0, 50.0]]}, tmp_path / "m.png")
    (fig,) = drawn
    ax, joint = fig.axes[0], fig.axes[1]
    assert sorted(t.get_text() for t in ax.texts) == sorted(["80", "60", "70", "50", "55", "65"])
    image = ax.get_images()[0].get_array()
    assert [bool(image.mask[j][i]) for j in range(3) for i in range(3)] == [i > j for j in range(3) for i in range(3)]
    assert sorted(t.get_text() for t in joint.texts) == ["40", "45", "50"]
    # As training now writes those cells: None (not evaluated), drawn as the values above were.
    drawn.clear()
    plots.heatmaps({"Task-IL": [[80.0, None, None], [60.0, 70.0, None], [50.0, 55.0, 65.0]]}, tmp_path / "m.png")
    assert sorted(t.get_text() for t in drawn[0].axes[0].texts) == sorted(["80", "60", "70", "50", "55", "65"])


def test_forgotten_and_kept_share_their_bins(drawn, tmp_path, monkeypatch):
    """The score stage's histogram binned each series over its own range: two samples of one
    distribution looked unlike (bars ten times wider for the wider one)."""
    import numpy as np

    from stages.pipeline import score

    monkeypatch.chdir(tmp_path)
    n = 8
    data = {"split": np.array(["train"] * n), "label": np.array([0] * 4 + [1] * 4), "task": np.zeros(n, int),
            "mi": np.array([0.01, 0.012, 0.015, 0.011, 0.001, 0.1, 0.19, 0.05]), "entropy": np.zeros(n),
            "correct_own": np.full(n, True), "forgotten": np.array([True] * 4 + [False] * 4),
            "mi_final": np.array([0.1, 0.3, 0.2, 0.2, 0.5, 0.5, 0.7, 0.3])}
    score._summaries(data, {"train_counts": [4, 2], "class_order": [0, 1], "class_names": ["a", "b"], "n_tasks": 2})
    (hist,) = [f for f in drawn if f.axes[0].get_title() == "Forgotten vs kept training samples"]
    assert len({round(p.get_width(), 9) for p in hist.axes[0].patches}) == 1
    # Uncertainty against frequency: the own-task model's MI (a softmax over the classes seen by then)
    # and the final model's (over every class) side by side; class b by hand: (0.5+0.5+0.7+0.3)/4 = 0.5.
    (sc,) = [f for f in drawn if f.axes[0].get_title() == "Uncertainty against class frequency"]
    own, final = (np.asarray(c.get_offsets()).ravel().tolist() for c in sc.axes[0].collections)
    assert own == pytest.approx([4, 0.012, 2, 0.08525]) and final == pytest.approx([4, 0.2, 2, 0.5])


def test_bars_of_many_classes_are_lines_in_a_figure_of_readable_width(drawn, tmp_path):
    """TinyImageNet's 200 classes after 10 tasks as bar groups: a figure 105 inches wide (11,550
    pixels), each task's bar under a pixel. Above 20 classes each snapshot is a line instead; a
    class not seen yet (NaN) still draws nothing."""
    import numpy as np

    values = [[float(c) if c < 20 * (k + 1) else math.nan for c in range(200)] for k in range(10)]
    plots.bars_by_task(values, "||w_c||", "norms", tmp_path / "n.png")
    plots.bars_by_task([[1.0, 2.0], [1.5, math.nan]], "count", "buffer", tmp_path / "b.png")
    many, few = drawn
    assert many.get_size_inches()[0] <= 12 and not many.axes[0].patches
    lines = many.axes[0].get_lines()
    assert len(lines) == 10 and np.count_nonzero(~np.isnan(lines[3].get_ydata())) == 80
    assert len(few.axes[0].patches) == 4  # bars, as before (the NaN one of no height)


def test_a_histogram_with_nothing_to_draw_says_so(drawn, tmp_path):
    plots.histograms({"forgotten": [], "kept": []}, "MI", "t", tmp_path / "h.png")
    (fig,) = drawn
    assert fig.axes[0].get_legend() is None
    assert [t.get_text() for t in fig.axes[0].texts] == ["no samples in forgotten or kept"]


def test_a_scatter_with_no_finite_value_says_so(drawn, tmp_path):
    """PNN has no MC-dropout score: both MI series all NaN, and the log axis over no point failed to
    draw (a ValueError that stopped the score stage)."""
    nan = math.nan
    plots.scatter([10, 100], {"own": [nan, nan], "final": [nan, nan]}, "count", "MI", "t", tmp_path / "s.png")
    plots.scatter([10, 100], {"own": [nan, nan], "final": [0.1, 0.2]}, "count", "MI", "t", tmp_path / "t.png")
    none, one = drawn
    assert [t.get_text() for t in none.axes[0].texts] == ["no finite values to draw"]
    assert len(one.axes[0].collections) == 1 and one.axes[0].get_xscale() == "log"
    import io

    for fig in drawn:  # drawing is where the log axis failed
        fig.savefig(io.BytesIO(), format="png")
