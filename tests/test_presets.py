"""PBR's presets (what `auto` means for the paper's open points) and the score stage asking the
trained run, not today's params.yaml, what it scores at."""

import os
import shutil

import pytest

import fakedata
from stages.runtime.config import ConfigError, from_dict

# The pipeline's defaults before the preset existed, spelled out (params.yaml at 313ea22): the
# tuned preset must train exactly these, or every earlier result would stop being comparable.
SPELLED_OUT = {"tau1": 1.0, "buffer_order": "uncertain_weighted", "walk_candidate": "hold", "offset": "task",
               "mi_logits": "scaled", "kl_classes": "old"}
# The paper as written (its Eq. MCE, Eq. 3, the walk's text, the MC equation, Eq. KL; lr of its protocol).
PAPER = {"tau1": 0.1, "lr": 0.03, "buffer_order": "certain_first", "walk_candidate": "hold", "offset": "class",
         "mi_logits": "cosine", "kl_classes": "all"}


def _settings(method: dict, train: dict | None = None):
    import torch

    from stages.pipeline import train as stage

    cfg = from_dict({"method": {"name": "pbr", "pbr": method}, "train": {"device": "cpu", "precision": "fp32", **(train or {})}})
    run = stage.settings(cfg, torch.device("cpu"))
    return run.values, run.sources


def test_the_tuned_preset_trains_what_the_spelled_out_defaults_trained():
    auto, _ = _settings({})
    spelled, _ = _settings(dict(SPELLED_OUT), {"lr": 0.1})
    assert auto == spelled


def test_the_paper_preset_is_the_paper_as_written_and_says_so():
    s, sources = _settings({"preset": "paper"})
    assert {k: s[k] for k in PAPER} == PAPER
    assert all(sources[k].startswith("preset paper") for k in PAPER)
    # Everything the paper does not fix stays as the tuned run has it.
    tuned, _ = _settings({})
    assert {k: v for k, v in s.items() if k not in PAPER and k != "preset"} == \
        {k: v for k, v in tuned.items() if k not in PAPER and k != "preset"}


def test_a_key_set_beside_the_preset_wins_over_it():
    s, sources = _settings({"preset": "paper", "tau1": 1.0, "buffer_order": "random"}, {"lr": 0.1})
    assert (s["tau1"], s["buffer_order"], s["lr"]) == (1.0, "random", 0.1)
    assert (s["offset"], s["kl_classes"]) == ("class", "all")
    assert sources["tau1"] == "params"


def test_an_unknown_preset_is_a_one_line_error_naming_the_key():
    with pytest.raises(ConfigError) as e:
        from_dict({"method": {"pbr": {"preset": "literal"}}})
    assert "method.pbr.preset" in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny PBR run, trained once, with the MI at the bare cosines (mi_logits: cosine) and tau1 0.5:
    the walk scored at temperature tau1 * s = 5 on the logits s * cos."""
    from stages.pipeline import prepare, train

    root = tmp_path_factory.mktemp("scored")
    fakedata.write_cifar(root / "raw", 10, 40, 6)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        cfg = _stage_cfg(root, tau1=0.5, mi_logits="cosine")
        prepare.run(cfg, log=lambda *_: None)
        train.run(cfg, log=lambda *_: None)
    finally:
        os.chdir(cwd)
    return root


def _stage_cfg(root, score=None, **method):
    return from_dict({"data": {"root": str(root / "raw"), "download": False, "imbalance_ratio": 0.1},
                      "model": {"width": 4}, "method": {"name": "pbr", "buffer_size": 20, "pbr": {"mc_samples": 3, **method}},
                      "train": {"epochs": 1, "device": "cpu", "precision": "fp32", "threads": 1},
                      "score": score or {}})


def _scores(root, tmp_path, cfg):
    import pyarrow.parquet as pq

    from stages.pipeline import score

    for d in ("data", "artifacts"):
        shutil.copytree(root / d, tmp_path / d, symlinks=True, dirs_exist_ok=True)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        score.run(cfg, log=lambda *_: None)
        return pq.read_table(tmp_path / "artifacts/score/scores.parquet").to_pandas()
    finally:
        os.chdir(cwd)


def test_scoring_follows_the_trained_run_not_todays_params(trained, tmp_path):
    from pbr.errors import UserError

    as_trained = _scores(trained, tmp_path / "a", _stage_cfg(trained, tau1=0.5, mi_logits="cosine"))
    # auto in today's params.yaml (whatever today's defaults would pick): the run as it was trained.
    auto = _scores(trained, tmp_path / "b", _stage_cfg(trained))
    assert as_trained["mi"].equals(auto["mi"]) and as_trained["entropy"].equals(auto["entropy"])
    # other values written out: refused in one line, rather than scored under a label the run never had
    with pytest.raises(UserError, match="method.pbr.mi_logits = 'cosine' but the params file says 'scaled'"):
        _scores(trained, tmp_path / "e", _stage_cfg(trained, tau1=0.1, mi_logits="scaled"))
    # The run's own temperature is tau1 * s = 0.5 * 10: giving it explicitly scores the same, and
    # another one does not (so the check above could have failed).
    explicit = _scores(trained, tmp_path / "c", _stage_cfg(trained, score={"temperature": 5.0}))
    other = _scores(trained, tmp_path / "d", _stage_cfg(trained, score={"temperature": 0.5}))
    assert (as_trained["mi"] - explicit["mi"]).abs().max() < 1e-6
    assert (as_trained["mi"] - other["mi"]).abs().max() > 1e-3


def test_the_scoring_dropout_is_the_rate_the_run_scored_its_walk_at():
    """score.dropout auto asks the run's method: PBR scores at the rate its walk used (its
    mc_dropout, else the trained rate); a method that never scores at its trained rate, and at 0.1
    when it trained without dropout (MC dropout needs a rate)."""
    from stages.runtime.run_settings import RunSettings

    def rate(**s):
        return RunSettings.saved(s).score_dropout()

    assert rate(method="pbr", dropout=0.1, mc_dropout="auto") == 0.1
    assert rate(method="pbr", dropout=0.1, mc_dropout=0.3) == 0.3
    assert rate(method="pbr", dropout=0.2) == 0.2  # saved before mc_dropout existed
    assert rate(method="er", dropout=0.0) == 0.1 and rate(method="er", dropout=0.25) == 0.25


def test_the_scoring_drops_in_the_backbone_where_the_runs_walk_did(trained, tmp_path):
    """score_backbone asks the run's method: PBR's passes drop the backbone's last feature map when
    its walk's did (mc_backbone), no other method's do. The same trained weights, saved once as
    a run with mc_backbone false and once as one with true, score the same predictions and other MI."""
    import torch

    from stages.runtime.run_settings import RunSettings

    assert RunSettings.saved({"method": "pbr", "mc_backbone": True}).score_backbone() is True
    assert RunSettings.saved({"method": "pbr", "mc_backbone": False}).score_backbone() is False
    assert RunSettings.saved({"method": "pbr"}).score_backbone() is False  # saved before the key existed
    assert RunSettings.saved({"method": "er"}).score_backbone() is False

    run = shutil.copytree(trained, tmp_path / "run", symlinks=True)
    head_only = _scores(run, tmp_path / "a", _stage_cfg(run))
    for model in (run / "artifacts/train").glob("task_*/model.pt"):
        saved = torch.load(model, map_location="cpu", weights_only=False)
        assert saved["settings"]["mc_backbone"] is False
        saved["settings"]["mc_backbone"] = True
        torch.save(saved, model)
    both = _scores(run, tmp_path / "b", _stage_cfg(run))
    assert both["correct_final"].equals(head_only["correct_final"]) and both["correct_own"].equals(head_only["correct_own"])
    assert (both["mi"] - head_only["mi"]).abs().max() > 1e-4
