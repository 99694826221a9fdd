"""A trained method, rebuilt from its saved task: what the train, score and evaluate stages share.

The saved settings (model.pt's `settings`, every "auto" resolved when the run trained) rebuild the
method; today's params.yaml is never consulted, so a stage run after params.yaml changed still reads
the run as it was trained.
"""

from __future__ import annotations

from pathlib import Path

from stages.runtime import artifacts

# What to do about a missing or damaged file of a saved task (artifacts.read's one line).
# `--force`: a damaged file is one DVC does not have, which a plain checkout refuses to replace.
TASK_FIX = ("restore it with `dvc checkout --force artifacts/train`, or delete its task folder and run `dvc repro` "
            "(training resumes after the task before it)")
# ... and of the run's own records (run.json, accuracy.json).
RECORD_FIX = ("restore it with `dvc checkout --force artifacts/train`, or delete artifacts/train and run `dvc repro` "
              "(it trains again)")


def keeps_buffer(tasks: list[Path]) -> bool:
    """Whether the run saves a buffer.parquet with each task (a run saves it with every task or none),
    so that one missing is a lost file, not a method without a buffer."""
    return any((t / "buffer.parquet").is_file() for t in tasks)


# Training params that leave the trained run as it is: where it ran and on how many threads (the
# resolved device is recorded with the run; a thread count only moves the last digits on a CPU).
_NOT_TRAINING = ("train.device", "train.threads")


def trained_params(cfg) -> dict:
    """The params.yaml values a trained run was trained with (run.json's `params`)."""
    return {k: v for k, v in cfg.flat().items()
            if k.split(".")[0] in ("seed", "method", "model", "train") and k not in _NOT_TRAINING}


def refuse_other_params(cfg, record: dict) -> None:
    """Score and evaluate record their results under today's params.yaml: it must still say what
    artifacts/train was trained with (one line naming the first key that differs). `auto`, on
    either side, is the run's own value (its resolved.* tags say which), whatever today's defaults
    or machine would pick, so the stages read the run as it was trained. A run.json written before
    it kept its params is taken as it is."""
    from pbr.errors import UserError
    from stages.runtime import paths

    then, now = record.get("params"), trained_params(cfg)
    if then is None:
        return
    resolved = record.get("settings", {})
    for key in sorted(set(then) | set(now)):
        was, says = then.get(key), now.get(key)
        if was == says or says == "auto":  # today's auto reads as the run's own value (its resolved.* tags)
            continue
        if was == "auto":
            # An explicit value where the run had auto: the same only if auto resolved to it (the
            # run's tags say resolved.lr 0.1; a param lr 0.05 beside them would be the report's row).
            got = resolved.get(key.split(".")[-1], None)
            if got in (None, "auto") or _same(got, says):  # "auto" kept: the method answers later (mc_dropout)
                continue
            raise UserError(f"{paths.TRAIN} was trained with {key} = auto, which it resolved to {got!r}, but the "
                            f"params file says {says!r}; run `dvc repro` (or pbr train, then the stages after it)")
        raise UserError(f"{paths.TRAIN} was trained with {key} = {was!r} but the params file says "
                        f"{says!r}; run `dvc repro` (or pbr train, then the stages after it)")


def _same(a, b) -> bool:
    """A resolved value and a params value alike (0.1 and "0.1", 50 and 50.0)."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def check_trained(cfg, manifest: dict) -> None:
    """Before score or evaluate read the trained run: params.yaml still says what prepared its data
    and what trained it."""
    from stages.runtime.config import refuse_stale

    refuse_stale(cfg, manifest)
    record = saved_run()
    if record is None:  # without it no params or data could be checked: the run is not read blind
        from pbr.errors import UserError
        from stages.runtime import paths

        raise UserError(f"{paths.TRAIN / 'run.json'} is missing; " + RECORD_FIX)
    refuse_other_params(cfg, record)
    refuse_other_data(record, manifest)


def check(cfg) -> None:
    """What score and evaluate refuse before they start (and their MLflow run with it): no prepared
    data, no finished training, or a trained run the params file (or the prepared data) no longer
    describes."""
    from pbr.data.shards import load_manifest
    from stages.runtime import paths

    manifest = load_manifest(paths.PREPARED)
    finished_summary()
    check_trained(cfg, manifest)


def finished_summary() -> dict:
    """artifacts/train/accuracy.json, the record training writes last: missing, training has not
    finished; without its parts, it is not a finished run's (one line either way)."""
    from pbr.errors import UserError
    from stages.runtime import paths

    path = paths.TRAIN / "accuracy.json"
    if not path.is_file():
        raise UserError(f"{path} is missing: training has not finished; run `dvc repro train` (or pbr train)")
    summary = artifacts.read_json(path, RECORD_FIX)
    lacking = [k for k in ("settings", "class_il", "task_il") if not isinstance(summary.get(k), dict)]
    if lacking or "method" not in summary["settings"] or any("matrix" not in summary[k] for k in ("class_il", "task_il")):
        raise UserError(f"{path} is not a finished run's record (it lacks {', '.join(lacking) or 'its matrices'}); "
                        + RECORD_FIX)
    return summary


def refuse_other_data(record: dict, manifest: dict) -> None:
    """The trained run was trained on the data/prepared there now: prepared again with other data
    settings (and `pbr score` run by hand, or `dvc repro -s score`), its models would be scored and
    evaluated on another stream and recorded as a complete run of today's settings. A run.json
    written before it kept the manifest's hash is checked on its number of tasks and the classes
    its first task learned (an ordered and a shuffled stream differ there)."""
    from pbr.data.shards import manifest_hash
    from pbr.errors import UserError
    from stages.runtime import paths

    then = record.get("data_manifest")
    if then is not None:
        other = then != manifest_hash(paths.PREPARED)
    else:
        other = record.get("n_tasks") != manifest["n_tasks"] or _first_classes() not in (None, sorted(manifest["task_classes"][0]))
    if other:
        raise UserError(f"{paths.TRAIN} was trained on other prepared data than {paths.PREPARED} holds now; "
                        f"run `dvc repro` (or pbr train, then the stages after it)")


def _first_classes() -> list[int] | None:
    """The classes the run's first task learned (its model.pt's classes_seen), None where unreadable
    (the stage's own read of it then says what is wrong)."""
    import torch

    from stages.runtime import paths

    try:
        return list(torch.load(paths.TRAIN / "task_00" / "model.pt", map_location="cpu", weights_only=False)["classes_seen"])
    except Exception:
        return None


def saved_run() -> dict | None:
    """artifacts/train/run.json (what the trained run was: its settings, params, machine), or None."""
    from stages.runtime import paths

    run = paths.TRAIN / "run.json"
    if not run.is_file():
        return None
    return artifacts.read_json(run, RECORD_FIX)


def saved_run_tags() -> dict:
    """The trained run's MLflow tags (run_settings.trained_tags), set again by a later stage's run."""
    from stages.runtime.run_settings import trained_tags

    record = saved_run()
    return trained_tags(record) if record is not None else {}


def saved_run_params() -> dict:
    """The trained run's MLflow params (run_settings.trained_run_params), logged again by evaluate."""
    from stages.runtime.run_settings import trained_run_params

    record = saved_run()
    return trained_run_params(record) if record is not None else {}


def let_the_resume_store_go() -> None:
    """The evaluate stage's last step: the pipeline of the trained run is complete and, under DVC,
    its training committed, so the copy of its tasks kept for a killed `dvc exp run` or queued run
    (stages/runtime/resume.py) is no longer needed. Not sooner: a queued run killed while scoring
    is run again from the baseline's outputs, and would train again from the first task."""
    from stages.runtime import resume

    record = saved_run()
    if record is not None:
        resume.forget(record.get("fingerprint", ""))


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

    from stages.runtime.run_settings import RunSettings

    saved = artifacts.read(path, lambda p: torch.load(p, map_location=device, weights_only=False), TASK_FIX)
    method = build_method(RunSettings.saved(saved["settings"]), manifest, device, generator)
    method.load_model_state(saved)
    for net in method.networks():
        net.eval()
    return method, saved
