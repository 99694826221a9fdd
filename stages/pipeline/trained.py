"""A trained method, rebuilt from its saved task: what the train, score and evaluate stages share.

The saved settings (model.pt's `settings`, every "auto" resolved when the run trained) rebuild the
method; today's params.yaml is never consulted, so a stage run after params.yaml changed still reads
the run as it was trained.
"""

from __future__ import annotations

from pathlib import Path

from stages.runtime import artifacts

# What to do about a missing or damaged file of a saved task (artifacts.read's one line).
TASK_FIX = ("restore it with `dvc checkout artifacts/train`, or delete its task folder and run `dvc repro` "
            "(training resumes after the task before it)")


def keeps_buffer(tasks: list[Path]) -> bool:
    """Whether the run saves a buffer.parquet with each task (a run saves it with every task or none),
    so that one missing is a lost file, not a method without a buffer."""
    return any((t / "buffer.parquet").is_file() for t in tasks)


def let_the_resume_store_go() -> None:
    """The score and evaluate stages' first step: the trained run is complete and, under DVC,
    committed (both depend on it), so the copy of its tasks kept for a killed `dvc exp run`
    (stages/runtime/resume.py) is no longer needed."""
    from stages.runtime import paths, resume

    run = paths.TRAIN / "run.json"
    if run.is_file():
        resume.forget(artifacts.read_json(run).get("fingerprint", ""))


def build_method(s, manifest: dict, device, generator, init_generator=None):
    """The method of the run settings `s` (a RunSettings) on a fresh network, for the prepared data of
    `manifest`."""
    import torch

    from pbr.data.augment import MEAN_STD, Augment, normalize
    from pbr.methods import Context
    from pbr.models import Net

    mean, std = MEAN_STD[manifest["dataset"]]
    fmt = torch.channels_last if s["channels_last"] else torch.contiguous_format
    augment = Augment(mean, std)
    ctx = Context(n_classes=manifest["n_classes"],
                  task_classes=[torch.tensor(c, device=device) for c in manifest["task_classes"]], device=device,
                  augment=lambda x, g: augment(x, g).contiguous(memory_format=fmt),
                  preprocess=lambda x: normalize(x, mean, std).contiguous(memory_format=fmt), generator=generator,
                  replay_batch_size=s["replay_batch_size"], eval_batch_size=s["eval_batch_size"],
                  autocast_dtype=torch.bfloat16 if s["precision"] == "bf16" else None)
    net = Net(manifest["n_classes"], s["width"], s["head"], s["scale"], s["dropout"], generator=init_generator).to(
        device, memory_format=fmt)
    return s.method(net, ctx, s.options(manifest["dataset"]))


def load_method(path: Path, manifest: dict, device, generator):
    """The method as saved after a task (model.pt), ready to predict."""
    import torch

    from stages.pipeline.run_settings import RunSettings

    saved = artifacts.read(path, lambda p: torch.load(p, map_location=device, weights_only=False), TASK_FIX)
    method = build_method(RunSettings.saved(saved["settings"]), manifest, device, generator)
    method.load_model_state(saved)
    for net in method.networks():
        net.eval()
    return method, saved
