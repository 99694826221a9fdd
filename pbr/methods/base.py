"""The interface every continual method shares: observe a batch, end a task.

In the spirit of Mammoth's ContinualModel: a method owns the network, its optimiser and
(when it has one) the replay buffer; the training loop only feeds it batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, ClassVar, Literal

import torch
import torch.nn.functional as F

from pbr.buffer import Buffer
from pbr.memory import Memory, TaskEnd
from pbr.models import Net


@dataclass
class Context:
    """What a method needs to know about the stream and the machine."""

    n_classes: int
    task_classes: list[torch.Tensor]  # per task, its class indices (on the device)
    device: torch.device
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor]  # uint8 -> augmented float batch
    preprocess: Callable[[torch.Tensor], torch.Tensor]  # uint8 -> normalised float batch (eval)
    generator: torch.Generator  # every draw of the method (buffer, order) comes from here
    replay_batch_size: int = 32
    eval_batch_size: int = 128
    autocast_dtype: torch.dtype | None = None  # e.g. torch.bfloat16 for the training step
    # The network runs as CUDA graphs (compiled with mode reduce-overhead): each training step then
    # starts a new graph generation, so a step never reads outputs the previous one overwrote.
    cuda_graphs: bool = False

    def seen_classes(self, task: int) -> torch.Tensor:
        """Classes of tasks 0..task."""
        return torch.cat(self.task_classes[: task + 1])


Auto = Literal["auto"]


@dataclass(frozen=True)
class Setting:
    """A hyper-parameter a method reads, spelled `method.<method name>.<key>` in params.yaml (its
    own section, so two methods' keys never collide), or `method.<key>` when `shared` (one value
    for every method that reads it, declared alike by each). The config is built from these."""

    key: str
    type: Any  # float, int, bool, a Literal[...] of words, or a union with Auto
    default: Any  # params.yaml's value when the key is left out ("auto": the method's own value)
    doc: str
    check: Callable[[Any], bool] | None = None  # range check of a non-auto value
    allowed: str = ""  # what a bad value's error says may be used (else read from the type)
    # How a value other than the method's own reads in a table's row label (the value as text in,
    # e.g. "PBR (per-class offset)"); None: "key value". in_label False: never named (a setting
    # the budget names, like the reservoir's rule).
    label: Callable[[str], str] | None = field(default=None, compare=False)
    in_label: bool = True
    # A preset: it picks what "auto" means for other keys, so a run is labelled by the preset and
    # by the keys that differ from that preset's values.
    selects_defaults: bool = False
    # What a run recorded before this setting existed ran with, where that differs from `default`
    # (the setting switched on a behaviour change): the report reads such a run with it.
    before: Any = None
    # One key for every method that reads it (the replay memory's feeding rule), not per method.
    shared: bool = False


@dataclass(frozen=True)
class Best:
    """A published best setting of a method: `values` for `dataset` at `buffer_size` (None: every
    buffer size), with where it was published."""

    dataset: str
    buffer_size: int | None
    values: dict[str, Any]
    source: str


DECLARED = "the method's declared default"  # a source: a setting's `default` (no params value, no best)


def non_negative(v) -> bool:
    return v >= 0


def positive(v) -> bool:
    return v > 0


# Settings several methods declare alike (each in its own section but RESERVOIR, which is shared).
ALPHA = Setting("alpha", float | Auto, "auto", "the method's first loss weight", non_negative, "a number >= 0 or auto",
                label=lambda v: f"alpha {v}")
BETA = Setting("beta", float | Auto, "auto", "the method's second loss weight", non_negative, "a number >= 0 or auto",
               label=lambda v: f"beta {v}")
RESERVOIR = Setting("reservoir", Literal["every_epoch", "first_epoch"], "every_epoch",
                    "the online reservoir is offered every epoch's batches (Mammoth) or the task's first epoch's "
                    "only (each sample once, whatever the task's epochs)", in_label=False, shared=True)
TAU2 = Setting("tau2", float, 2.0, "temperature of the distillation", positive, "a positive number (2 in the paper)",
               label=lambda v: f"tau2 {v}")
WEIGHT_DECAY = Setting("weight_decay", float | Auto, "auto", "the SGD's weight decay", non_negative,
                       "a number >= 0 or auto")
MAMMOTH = "Mammoth utils/best_args.py @5bb9275"  # the DER paper's grid-searched best settings
# Mammoth @5bb9275 trains seq-cifar100 (alone of its data sets) under datasets/seq_cifar100.py
# get_scheduler: the SGD rebuilt at each task's start with MultiStepLR([35, 45], gamma 0.1), stepped
# after each of its 50 epochs. Its best_args there were tuned under that schedule, so they carry it.
SEQ_CIFAR100_SCHEDULE = {"lr_milestones": (0.7, 0.9)}
SEQ_CIFAR100 = (f"{MAMMOTH} seq-cifar100; lr_milestones: datasets/seq_cifar100.py get_scheduler (MultiStepLR "
                "[35, 45] of 50 epochs)")
# The entry for buffer 200, which best_args lacks: buffer 500's values, so that a Table 2 row trains
# alike in both its buffer columns.
SEQ_CIFAR100_NO_200 = (f"{MAMMOTH} seq-cifar100 buffer 500 (best_args has no 200); lr_milestones: "
                       "datasets/seq_cifar100.py get_scheduler (MultiStepLR [35, 45] of 50 epochs)")


def milestone_drops(milestones: tuple[float, ...], epoch: int, epochs: int) -> int:
    """How many tenths the lr has taken by (0-based) `epoch` of a task of `epochs`: a milestone f
    falls after epoch round(f * epochs), at least the first (0.7 and 0.9 of 50: after epochs 35 and 45), as Mammoth's
    MultiStepLR stepped after each epoch."""
    # At least after the first epoch: MultiStepLR, stepped after each epoch, never reaches milestone 0.
    return sum(max(1, round(f * epochs)) <= epoch for f in milestones)


# A method's `role`: the grids of `pbr sweep` it runs in (stages/experiments/sweep.py), besides those its
# own `grids` name. Every role runs in `families`.
ROLES = {
    "bound": "the paper's bounds (SGD, JOINT): table2, at IR 0.01 and on the balanced stream",
    "baseline": "the paper's Table 2 (table2: at buffers 200 and 500 where it keeps one)",
    "ltcl": "the paper's Table 1 (table1: the long-tailed continual learning methods, PODNet+)",
    "ours": "the proposed method (PBR): table1, table2, table3, table5 and fidelity, with its ablations",
    "extra": "a method the paper does not run: families only (its sweeps: --only method.name=...)",
}


class Options(SimpleNamespace):
    """A method's resolved settings (lr, buffer_size, and each key the method declares)."""


class ContinualMethod:
    name: ClassVar[str] = "base"
    label: ClassVar[str] = "base"  # as the paper's tables write it
    # The replay memory's policy (pbr/memory/): what the buffer keeps; None: no replay memory.
    memory: ClassVar[type[Memory] | None] = None
    uses_buffer: ClassVar[bool] = False  # memory is not None (set for each subclass)
    # Its place in the grids `pbr sweep` runs (ROLES): "baseline" puts it in the paper's Table 2.
    role: ClassVar[str] = "baseline"
    # The paper's named ablations of the method: its own keys over its settings (PBR's "Ours -
    # Random" in two readings); `pbr sweep` runs each beside the method where the paper does.
    ablations: ClassVar[dict[str, dict[str, Any]]] = {}
    # The paper's experiments the method takes part in beyond what its role says (`pbr sweep`'s
    # grids "table3", "table5", "fidelity"); read off the class itself, not inherited.
    grids: ClassVar[tuple[str, ...]] = ()
    # Where its variants sit in a table (their labels, "" for the method at its own settings); the
    # ones not listed follow.
    row_order: ClassVar[tuple[str, ...]] = ()
    # The keys of params.yaml's `method` section this method reads (beyond name and buffer_size).
    settings: ClassVar[tuple[Setting, ...]] = ()
    # "auto" resolves to the first `best` entry for the run's dataset and buffer size, else to
    # `defaults` (the paper's common protocol: plain SGD at a constant lr 0.03, a linear head, no dropout).
    defaults: ClassVar[dict[str, Any]] = {"lr": 0.03, "lr_milestones": (), "head": "linear", "dropout": 0.0,
                                         "weight_decay": 0.0}
    defaults_source: ClassVar[str] = "the paper's common protocol (SGD at a constant lr 0.03, a linear head, no dropout)"
    best: ClassVar[tuple[Best, ...]] = ()
    # Whether its runs may train as lanes of one process (pbr.lockstep): set where a test holds the
    # laned runs to the separate ones (tests/test_lockstep.py). Not inherited.
    laned: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.uses_buffer = cls.memory is not None
        if cls.role not in ROLES:  # a typo would leave it out of every paper grid, silently
            raise TypeError(f"method {cls.name!r} ({cls.__name__}): role {cls.role!r} is not one of "
                            f"{' | '.join(ROLES)} (extra: a method the paper does not run, families only)")

    def __init__(self, net: Net, ctx: Context, opts: Options) -> None:
        self.net, self.ctx, self.opts = net, ctx, opts
        self.policy: Memory | None = None  # the `memory` policy over the buffer, built at the first task
        if self.uses_buffer and opts.buffer_size < 1:
            raise ValueError(f"{self.name} needs a replay buffer: buffer size must be >= 1")
        self.task = -1
        self.epoch = 0
        self.opt: torch.optim.Optimizer | None = None
        # Training accuracy on current-task samples, summed on the device (read once an epoch).
        self.correct = torch.zeros((), dtype=torch.int64, device=ctx.device)

    @classmethod
    def least_buffer(cls, n_classes: int, n_tasks: int, settings: dict[str, Any]) -> tuple[int, str]:
        """The smallest buffer_size this method's memory (under these settings) works with on a stream
        of n_classes in n_tasks, and what for: refused before training, not found out tasks later."""
        return cls.memory.least_capacity(n_classes, n_tasks) if cls.memory is not None else (0, "")

    @classmethod
    def resolve(cls, key: str, value: Any, dataset: str, buffer_size: int) -> tuple[Any, str]:
        """A setting's value with "auto" replaced by this method's own, and where that came from."""
        if value != "auto":
            return value, "params"
        for b in cls.best:
            if b.dataset == dataset and b.buffer_size in (None, buffer_size) and key in b.values:
                return b.values[key], b.source
        if key in cls.defaults:
            return cls.defaults[key], cls.defaults_source
        if key in ContinualMethod.defaults:  # a method's `defaults` that names only what it changes
            return ContinualMethod.defaults[key], ContinualMethod.defaults_source
        for s in cls.settings:
            if s.key == key:
                return s.default, DECLARED
        raise KeyError(f"{cls.name} has no value for {key!r}")

    @classmethod
    def refuse(cls, settings: dict[str, Any]) -> str | None:
        """Why these resolved settings (head, dropout, lr, the declared keys) cannot run, or None."""
        return None

    @classmethod
    def variant_labels(cls, settings: dict[str, Any], own: dict[str, Any]) -> list[str]:
        """How a run reads beside the method's label in a table: one phrase for each declared
        setting whose value differs from the method's own (`own`: resolved the same way)."""
        def shown(s: Setting, v: Any) -> Any:  # an integer setting as an integer ("T 3", not "T 3.0")
            try:
                return str(int(float(v))) if s.type is int and float(v).is_integer() else v
            except (TypeError, ValueError):
                return v

        return [s.label(shown(s, settings[s.key])) if s.label else f"{s.key} {shown(s, settings[s.key])}"
                for s in cls.settings
                if s.in_label and s.key in settings and settings[s.key] != own.get(s.key)]

    @classmethod
    def score_temperature(cls, settings: dict[str, Any]) -> float:
        """The softmax temperature of the MC-dropout probabilities when a run of this method is
        scored (the score stage's `auto`), from the run's saved settings: 1, the logits as trained."""
        return 1.0

    @classmethod
    def score_samples(cls, settings: dict[str, Any]) -> int:
        """T, the MC-dropout passes when a run of this method is scored (the score stage's `auto`),
        from the run's saved settings: 20 (PBR's default T) for a method that never scores itself."""
        return 20

    @classmethod
    def score_dropout(cls, settings: dict[str, Any]) -> float:
        """The head's dropout rate when a run of this method is scored (the score stage's `auto`):
        the trained rate, or 0.1 for a network trained without dropout (MC dropout needs a rate)."""
        return settings.get("dropout") or 0.1

    def lane_refusal(self) -> str | None:
        """Why this run cannot train as a lane of one process (pbr.lockstep), or None."""
        if not type(self).__dict__.get("laned", False):
            return f"{self.name} has not been checked laned (its class sets no `laned = True`): it runs alone"
        return None

    @classmethod
    def score_backbone(cls, settings: dict[str, Any]) -> bool:
        """Whether the MC passes, when a run of this method is scored, also drop elements of the
        backbone's last feature map (pbr.uncertainty.mc_features): no, the head alone."""
        return False

    @classmethod
    def setting_keys(cls) -> tuple[str, ...]:
        return tuple(s.key for s in cls.settings)

    @classmethod
    def reads(cls, key: str, settings: dict[str, Any]) -> bool:
        """Whether `key` can change a run with these settings (PBR reads the reservoir's rule only
        when its buffer is an online reservoir): runs that differ only in unread keys are alike."""
        return key in cls.setting_keys()

    @classmethod
    def options(cls, dataset: str = "cifar10", buffer_size: int = 200, **given: Any) -> tuple[Options, dict[str, str]]:
        """Resolved settings (lr, lr_milestones and each declared key; "auto" or left out: the
        method's own value) and the source of each."""
        unknown = set(given) - {"lr", "lr_milestones", *cls.setting_keys()}
        if unknown:
            raise TypeError(f"{cls.name} has no setting {sorted(unknown)}; it reads lr, lr_milestones, "
                            f"{', '.join(cls.setting_keys())}")
        values: dict[str, Any] = {"buffer_size": buffer_size if cls.uses_buffer else 0}
        sources: dict[str, str] = {}
        for key, default in (("lr", "auto"), ("lr_milestones", "auto"), *((s.key, s.default) for s in cls.settings)):
            values[key], sources[key] = cls.resolve(key, given.get(key, default), dataset, buffer_size)
            if key not in given and sources[key] == "params":  # left out: no value of params'
                sources[key] = DECLARED
        # One spelling (a saved run's JSON gives a list): lanes and reruns compare it as a value.
        if isinstance(values["lr_milestones"], (list, tuple)):
            values["lr_milestones"] = tuple(float(f) for f in values["lr_milestones"])
        return Options(**values), sources

    # --- the two calls the loop makes (plus begin_task) ---------------------------------------
    def begin_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.task = task
        if self.memory is not None and self.policy is None:
            self.policy = self.make_policy(self._storage(tuple(images.shape[1:])))
        if self.policy is not None:
            self.policy.begin_task(task)
        # Plain SGD as in the paper (no momentum; weight decay only where a method's published
        # best has it), fresh for each task.
        self.opt = torch.optim.SGD(self.net.parameters(), lr=self.opts.lr,
                                   weight_decay=getattr(self.opts, "weight_decay", 0.0))

    def begin_epoch(self, epoch: int, epochs: int | None = None) -> None:
        """Before the epoch's first step (`epochs`: the task's count). Under lr_milestones every
        param group of the optimiser runs at its task-start lr times 0.1 per milestone passed
        (Mammoth's MultiStepLR, restarting with each task's fresh optimiser)."""
        self.epoch = epoch
        milestones = getattr(self.opts, "lr_milestones", ())
        if not milestones or self.opt is None:
            return
        if epochs is None:
            raise ValueError(f"{self.name}: begin_epoch needs the task's epochs under lr_milestones {milestones}")
        drops = milestone_drops(milestones, epoch, epochs)
        for group in self.opt.param_groups:
            lr = group.setdefault("initial_lr", group["lr"])  # the task's own (torch's schedulers' key)
            for _ in range(drops):  # one tenth at a time, as MultiStepLR multiplies (the same last bits)
                lr *= 0.1
            group["lr"] = lr

    def end_epoch(self, epoch: int, epochs: int) -> None:
        """After the epoch's last step (`epochs`: the task's count; PBR's mi_epochs scores here)."""

    def observe(self, x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        """One optimisation step on an augmented batch `x` (raw uint8 images in `raw`).
        Returns the detached loss (no host sync). The default: cross-entropy on the batch (plus
        whatever penalty() adds), i.e. plain fine-tuning."""
        out = self.net(x)
        self.count(out, y)
        return self.step(self.ce(out, y))

    def end_task(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> None:
        """Called once the task's epochs are done, with the task's raw training images."""
        self.update_memory(task, images, labels)

    def task_data(self, task: int, seen: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The data trained on during `task` (default: that task's own data)."""
        return seen[task]

    def with_memory(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A task's data and the whole memory after it (iCaRL's and PODNet's training set)."""
        if self.buffer is None or len(self.buffer) == 0:
            return images, labels
        n = len(self.buffer)
        return torch.cat([images, self.buffer.images[:n].to(images.device)]), \
            torch.cat([labels, self.buffer.labels[:n].to(labels.device)])

    # --- prediction: evaluation, scoring and the checkpoint go through the method ----------------
    # Whether predict() is the network's own output (the score stage then reads the prediction off
    # the MC pass instead of running the backbone again); False for e.g. a nearest-mean classifier.
    predicts_with_net: ClassVar[bool] = True
    # Whether predict() uses the task identity when given it (a column per task: PNN), and whether
    # it has a Class-IL prediction at all (PNN does not: the report prints "-").
    uses_task_identity: ClassVar[bool] = False
    class_il: ClassVar[bool] = True
    # Whether it learns each task as it comes; False (JOINT: nothing until the last task): only the
    # final accuracies mean anything, so it has no BWT or forgetting (the report prints "-").
    learns_each_task: ClassVar[bool] = True

    def predict(self, x: torch.Tensor, task: int | None = None) -> torch.Tensor:
        """Class scores [B, n_classes] of normalised images: the prediction is their argmax over
        the classes in play. `task` is the test task's identity where the scenario gives it
        (Task-IL); None in Class-IL."""
        return self.net(x)

    def networks(self) -> list[torch.nn.Module]:
        """Every network the method trains or predicts with (train/eval mode follows the loop)."""
        return [self.net]

    def classifier_norms(self) -> torch.Tensor:
        """The norm of each class's classifier vector (the paper's Figure 3: the head's bias)."""
        return self.net.head.weight.detach().float().norm(dim=1)

    def mc_network(self) -> torch.nn.Module | None:
        """The network whose head MC dropout samples when a run is scored, or None (no single head)."""
        return self.net

    def model_state(self) -> dict[str, Any]:
        """What the saved model holds: enough for predict() after load_model_state()."""
        return {"state_dict": self.net.state_dict()}

    def load_model_state(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["state_dict"])

    # --- the optimisation step and its hooks ---------------------------------------------------
    def penalty(self) -> torch.Tensor | None:
        """A term added to every step's loss (per-parameter penalties: EWC, SI)."""
        return None

    def after_backward(self) -> None:
        """Between backward and the optimiser's step: the gradients may be changed here
        (gradient projection: GEM, A-GEM)."""

    def after_step(self) -> None:
        """After the optimiser's step (SI's path integral)."""

    def quadratic_penalty(self, importance: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor]) -> torch.Tensor:
        """sum over parameters of importance * (theta - anchor)^2 (EWC's and SI's surrogate)."""
        return sum((importance[n] * (p - anchor[n]) ** 2).sum() for n, p in self.net.named_parameters())

    def step(self, loss: torch.Tensor) -> torch.Tensor:
        extra = self.penalty()
        if extra is not None:
            loss = loss + extra
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.after_backward()
        self.opt.step()
        self.after_step()
        return loss.detach()

    # --- helpers shared by the methods ---------------------------------------------------------
    def replay(self, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An augmented buffer batch: (x, labels, stored logits)."""
        idx = self.buffer.sample(n or self.ctx.replay_batch_size, self.ctx.generator)
        images, labels, _, logits = self.buffer.get(idx)
        return self.ctx.augment(images, self.ctx.generator), labels, logits

    def has_replay(self) -> bool:
        return self.buffer is not None and len(self.buffer) > 0

    def ce(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, y)

    def count(self, logits: torch.Tensor, y: torch.Tensor) -> None:
        """Add the current batch's correct predictions to `correct` (no host sync)."""
        self.correct += (logits.detach().argmax(1) == y).sum()

    # --- the replay memory: `memory` names its policy (pbr/memory/) ------------------------------
    @property
    def buffer(self) -> Buffer | None:
        """The memory's storage (None without a replay memory, or before the first task)."""
        return None if self.policy is None else self.policy.buffer

    def _storage(self, image_shape: tuple[int, ...]) -> Buffer:
        return Buffer(self.opts.buffer_size, image_shape, self.ctx.n_classes, self.ctx.device)

    def make_policy(self, buffer: Buffer) -> Memory:
        """The `memory` policy over `buffer`; a method whose settings choose or tune its policy
        (PBR's sampling, GEM's gem_memory, PRS's rho) builds it here."""
        return self.memory(buffer, self.ctx.generator, self)

    def update_memory(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> TaskEnd:
        """The memory's policy sees the task just learned (a policy filled online ignores it).
        Returns what it read, for a method that needs the same numbers (PODNet's features)."""
        end = TaskEnd(self, task, images, labels)
        if self.policy is not None:
            self.policy.end_task(end)
        return end

    def offers_this_epoch(self) -> bool:
        """Whether this epoch's batches go to the memory (`reservoir`: every epoch, as in Mammoth, or
        only the task's first, so each sample is offered once whatever the task's epochs)."""
        return getattr(self.opts, "reservoir", "every_epoch") == "every_epoch" or self.epoch == 0

    def offer(self, raw: torch.Tensor, y: torch.Tensor, logits: torch.Tensor | None = None) -> None:
        """Offer a batch's raw images to the memory after the step: an online policy keeps what its
        rule says, a policy that chooses at a task's end ignores it."""
        if self.policy is not None and self.offers_this_epoch():
            self.policy.offer(raw, y, torch.full_like(y, self.task), logits)

    # What a policy may ask about the task just learned (pbr/memory/base.py: TaskEnd).
    @torch.no_grad()
    def memory_features(self, images: torch.Tensor) -> torch.Tensor:
        """The network's features of raw images, in eval mode (herding ranks by them)."""
        was_training = self.net.training
        self.net.eval()
        bs = self.ctx.eval_batch_size
        feats = torch.cat([self.net.features(self.ctx.preprocess(images[i:i + bs]))
                           for i in range(0, images.shape[0], bs)])
        self.net.train(was_training)
        return feats

    def memory_logits(self, images: torch.Tensor) -> torch.Tensor:
        """The logits a per-task memory keeps with each sample: zeros (FDR keeps the network's)."""
        return torch.zeros(images.shape[0], self.ctx.n_classes, device=images.device)

    @torch.no_grad()
    def memory_scores(self, task: int, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Each sample's uncertainty (PBR's walk orders by it): the mutual information of 20
        MC-dropout passes of the network's head over the classes seen (PBR scores with its readings)."""
        from pbr.uncertainty import score_images

        mi, _ = score_images(self.net, images, 20, 1.0, self.ctx.eval_batch_size, self.ctx.preprocess,
                             self.ctx.generator, classes=self.ctx.seen_classes(task))
        return mi

    # --- exact resume ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # "buffer": the storage and the policy's counters (the policy's state_dict).
        return {"task": self.task, "buffer": self.policy.state_dict() if self.policy is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.task = state["task"]
        if state["buffer"] is not None:
            self.policy = self.make_policy(self._storage(tuple(state["buffer"]["images"].shape[1:])))
            self.policy.load_state_dict(state["buffer"])
