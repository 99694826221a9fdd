"""A run's settings with every "auto" resolved: the one object a run's stages read.

Built once when `pbr train` starts, from the validated Config and the device; the fingerprint, the
method, run.json, the MLflow tags (`resolved.*`, `source.*`) and every saved task (model.pt) take
it from here. The score and evaluate stages read it back from the saved task (`RunSettings.saved`),
never from today's params.yaml, and ask the run's method what to score and at which temperature.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pbr.errors import UserError
from stages.runtime import hardware
from stages.runtime.config import Config, method_values, unwritten_keys


@dataclass(frozen=True)
class RunSettings:
    values: dict[str, Any]  # what the run trains with: the method's keys, lr, head, width, epochs, ...
    sources: dict[str, str] = field(default_factory=dict)  # where each value came from, where known

    @classmethod
    def resolve(cls, cfg: Config, device) -> RunSettings:
        """The run's settings: the method's "auto"s from its published best or default for the run's
        dataset and buffer (a preset included), precision and memory layout from `device`."""
        from pbr.methods import METHODS
        from pbr.methods.base import DECLARED

        method = METHODS[cfg.method.name]
        m, t, mo, dataset = cfg.method, cfg.train, cfg.model, cfg.data.dataset
        opts, sources = method.options(dataset, m.buffer_size, lr=t.lr, lr_milestones=t.lr_milestones,
                                       **method_values(m))
        for key in unwritten_keys(m):  # left out of params.yaml: the declared default, said so
            if sources.get(key) == "params":
                sources[key] = DECLARED
        head, sources["head"] = method.resolve("head", mo.head, dataset, m.buffer_size)
        dropout, sources["dropout"] = method.resolve("dropout", mo.dropout, dataset, m.buffer_size)
        problem = method.refuse({"head": head, "dropout": dropout, **vars(opts)})
        if problem:
            raise UserError(f"method.name = {m.name}: {problem}")
        precision, channels_last, why = hardware.resolve(t.precision, t.channels_last, mo.width, device)
        if why:
            sources["hardware"] = why
        return cls({
            "method": m.name, **vars(opts), "head": head, "dropout": dropout,
            # a list, as run.json gives it back: the tags say the same at every stage
            "lr_milestones": list(opts.lr_milestones),
            "width": mo.width, "scale": mo.scale,
            "epochs": [cfg.epochs_of(k) for k in range(cfg.data.n_tasks)],
            "batch_size": t.batch_size, "replay_batch_size": t.replay_batch_size,
            "eval_batch_size": t.eval_batch_size, "seed": cfg.seed, "precision": precision,
            "channels_last": channels_last, "compile": t.compile,
        }, sources)

    @classmethod
    def saved(cls, values: dict[str, Any]) -> RunSettings:
        """The settings a saved task (model.pt `settings`, run.json) trained with."""
        return cls(dict(values))

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def method(self):
        """The run's method class."""
        from pbr.methods import METHODS

        return METHODS[self.values["method"]]

    def options(self, dataset: str):
        """The method's options as the run resolved them. A run saved before a setting existed gets
        that setting's declared default, which is what it ran with (before lr_milestones: a constant lr)."""
        buffer = max(self.values["buffer_size"], 1)
        keys = {k: self.values[k] for k in self.method.setting_keys() if k in self.values}
        opts, _ = self.method.options(dataset, buffer, lr=self.values["lr"],
                                      lr_milestones=self.values.get("lr_milestones", []), **keys)
        opts.buffer_size = buffer
        return opts

    def tags(self) -> dict[str, Any]:
        """MLflow tags: each resolved value, and where every value not written in params came from."""
        return {**{f"resolved.{k}": v for k, v in self.values.items()},
                **{f"source.{k}": v for k, v in self.sources.items() if v != "params"}}

    def params(self) -> dict[str, Any]:
        """MLflow params: each resolved value, as its tag `resolved.*` says it (the UI's parallel
        coordinates and scatter charts read params and metrics, not tags)."""
        return {f"resolved.{k}": v for k, v in self.values.items()}

    def score_temperature(self) -> float:
        """The MC-dropout softmax temperature the run's method scores at (the score stage's auto)."""
        return self.method.score_temperature(self.values)

    def score_dropout(self) -> float:
        """The head's dropout rate the run's method scores at (the score stage's auto)."""
        return self.method.score_dropout(self.values)

    def score_samples(self) -> int:
        """T, the MC-dropout passes the run's method scores with (the score stage's auto)."""
        return self.method.score_samples(self.values)

    def score_backbone(self) -> bool:
        """Whether the run's method drops the backbone's last feature map too when it scores."""
        return self.method.score_backbone(self.values)


def trained_tags(record: dict[str, Any]) -> dict[str, Any]:
    """The MLflow tags of a trained run, from its run.json: where it ran and every value it resolved.
    The train stage sets them, and the evaluate stage again: a run split across two stores (its
    server back mid-pipeline) has them in the part `pbr report` counts, the one holding evaluate."""
    where = {"pbr.device": record.get("device"), "pbr.gpu_sharing": record.get("gpu_sharing"),
             "pbr.threads": record.get("threads"), "pbr.fingerprint": record.get("fingerprint"),
             # the training code and data (a later stage's run, made at another commit, says its own git.commit)
             "pbr.code_sha256": record.get("code_sha256"), "pbr.data_manifest": record.get("data_manifest")}
    return {**{k: v for k, v in where.items() if v is not None},
            **RunSettings(record["settings"], record.get("sources", {})).tags()}


def trained_run_params(record: dict[str, Any]) -> dict[str, Any]:
    """The MLflow params of a trained run, from its run.json: every value it resolved (`resolved.*`).
    Logged with trained_tags, by the train stage and the evaluate stage (a run where DVC skipped train)."""
    return RunSettings(record["settings"]).params()
