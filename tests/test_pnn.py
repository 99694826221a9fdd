"""PNN: a column per task, the earlier ones frozen; Task-IL picks the test task's column."""

import torch

from pbr.loop import evaluate
from test_methods import _run_tasks, _setup, _task


def test_earlier_columns_are_frozen_and_task_il_uses_the_tasks_own_column():
    method, ctx = _setup("pnn", n_classes=4, n_tasks=2)
    _run_tasks(method, ctx, n_tasks=1)
    x = ctx.preprocess(_task(0, n=6, seed=9)[0])
    method.net.eval()
    with torch.no_grad():
        after_task0 = method.predict(x, task=0).clone()
    column0 = {k: v.clone() for k, v in method.net.columns[0].state_dict().items()}  # BN statistics too
    images, labels = _task(1)
    method.begin_task(1, images, labels)
    assert len(method.net.columns) == 2 and not any(p.requires_grad for p in method.net.columns[0].parameters())
    from pbr.loop import fit_task

    fit_task(method, images, labels, 2, 8)
    assert all(torch.equal(v, method.net.columns[0].state_dict()[k]) for k, v in column0.items())
    method.net.eval()
    with torch.no_grad():
        assert torch.equal(method.predict(x, task=0), after_task0)  # task 0 answers as it did
        # The new column reads the old one laterally: its logits differ from a column without it.
        col1 = method.net.columns[1]
        _, acts0 = method.net.columns[0](x, [])
        with_side, _ = col1(x, [acts0])
        col1.alpha4.zero_()
        for a in col1.alphas:
            a.zero_()
        without, _ = col1(x, [acts0])
    assert not torch.allclose(with_side, without)


def test_task_il_asks_each_tasks_column():
    method, ctx = _setup("pnn", n_classes=4, n_tasks=2)
    _run_tasks(method, ctx, n_tasks=2)
    tests = [_task(t, n=8, seed=20) for t in range(2)]
    _, t_row = evaluate(method, tests, 2, 4)
    for t, (images, labels) in enumerate(tests):
        with torch.no_grad():
            method.net.eval()
            scores = method.predict(ctx.preprocess(images), task=t)[:, ctx.task_classes[t]]
        own = ctx.task_classes[t][scores.argmax(1)]
        assert t_row[t] == 100 * (own == labels).float().mean().item()


def test_pnn_refuses_a_head_or_dropout_its_columns_do_not_have():
    import pytest

    from pbr.errors import UserError
    from stages.runtime.config import from_dict
    from stages.pipeline.train import settings

    with pytest.raises(UserError, match="method.name = pnn: its columns end in linear classifiers"):
        settings(from_dict({"method": {"name": "pnn"}, "model": {"head": "cosine"}}))
    s = settings(from_dict({"method": {"name": "pnn"}})).values
    assert (s["head"], s["dropout"]) == ("linear", 0.0)
