"""Lockstep lanes: L whole runs of one method trained together, each run in its own thread
running the unchanged task loop (`pbr.loop.train_tasks`), their networks the lanes of one
`pbr.lanes.Lanes`.

A run's `method.net` is a `LaneView`: its forward waits until every lane has handed in its batch,
then one laned forward serves them all and each thread gets its own lane's logits. The method's
`step` waits the same way for every lane's loss, then one backward of their sum and one plain SGD
step update every lane (lanes share no tensor, so each gets exactly its own loss's gradient).
Everything else stays the run's own: its data order, augmentation and replay draws (its
`Context.generator`), its buffer, its counters, its evaluation. So a method runs laned unchanged,
provided that the method says it can (`ContinualMethod.laned`, set where a test holds its laned
runs to its separate ones), that its step is the plain one (no penalty, no gradient surgery), that
it writes nothing into its network outside that step, and that every lane makes the same calls in
the same order, as the runs of one sweep cell do (the same data sizes, a buffer that fills alike).
A copy of the network (PBR's teacher) is laned too. A method that needs more says so when it
starts.

This is the shape weighed in docs/gpu.md against splitting every method's observe; it is not yet
what `pbr train` runs.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from pbr.lanes import Lanes, settings_differ
from pbr.methods.base import ContinualMethod

# The hooks of ContinualMethod.step: a method overriding any of them changes the step per lane.
_STEP_HOOKS = ("step", "penalty", "after_backward", "after_step")


class LaneFailed(RuntimeError):
    """Raised in every other lane when one lane (or the shared work) fails; its cause is that error."""


class Rendezvous:
    """L threads hand in one item each; the last to arrive runs `work(items)` for all of them and
    each thread gets back its own entry of the result. A thread that fails calls `abort`, and every
    thread waiting (or arriving later) raises instead of waiting forever; so does a thread that
    `leave`s (its run ended) while another still meets, since that meeting could never be whole."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._cond = threading.Condition()
        self._items: list[Any] = [None] * n
        self._arrived = 0
        self._round = 0
        self._results: Sequence[Any] | None = None
        self._error: BaseException | None = None
        self._left: list[int] = []

    def _gone(self) -> RuntimeError:
        return RuntimeError(f"lane {self._left[0]} finished its run while another lane still trains: the lanes of "
                            "one job must make the same calls (the same data sizes, epochs and tasks)")

    def meet(self, i: int, item: Any, work: Callable[[list[Any]], Sequence[Any]]) -> Any:
        with self._cond:
            if self._error is None and self._left:
                self._error = self._gone()
                self._cond.notify_all()
            if self._error is not None:
                raise LaneFailed("another lane failed") from self._error
            this = self._round
            self._items[i] = item
            self._arrived += 1
            if self._arrived == self.n:
                items, self._items, self._arrived = self._items, [None] * self.n, 0
                try:
                    self._results = work(items)
                except BaseException as e:
                    self._error = e
                self._round += 1
                self._cond.notify_all()
            else:
                while self._round == this and self._error is None:
                    self._cond.wait()
            if self._error is not None:
                raise LaneFailed("another lane failed") from self._error
            # Nobody starts the next round before every thread of this one has read its result.
            return self._results[i]

    def leave(self, i: int) -> None:
        """Lane i's run has ended: a lane waiting for it now, or arriving later, fails."""
        with self._cond:
            self._left.append(i)
            if self._arrived and self._error is None:
                self._error = self._gone()
            self._cond.notify_all()

    def abort(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()


class _Call(nn.Module):
    """`net.<name>(*args)` as a module's forward, so that torch.func.functional_call can run it
    with one lane's tensors (functional_call only calls forward)."""

    def __init__(self, net: nn.Module, name: str) -> None:
        super().__init__()
        self.net = net
        self.name = name

    def forward(self, *args: Any) -> Any:
        return getattr(self.net, self.name)(*args)


class _Version:
    """How many laned steps have run: a lane's materialised copy is current while this holds."""

    def __init__(self) -> None:
        self.steps = 0


class LaneView(nn.Module):
    """Lane i of a shared `Lanes`, standing where a method expects its single network.

    Laned: forward (every lane's batch in one call), `prototypes()` (the lane's own tensors, so
    its gradient reaches the lane), parameters, train/eval, state_dict, and a copy (a teacher:
    one frozen `Lanes` for every lane, made when every lane asks). Anything else (`head.scale`,
    `features` for scoring, the backbone's feature map) is read from `single`, the lane's own
    network loaded with the lane's current weights: for reading only, since nothing written there
    reaches the lanes (which is why a method that writes into its network, as PBR's `imprint`
    does, runs alone)."""

    def __init__(self, lanes: Lanes, i: int, meeting: Rendezvous, single: nn.Module, version: _Version) -> None:
        super().__init__()
        # Not registered as submodules: each view would otherwise own (and save) every lane.
        object.__setattr__(self, "_lanes", lanes)
        object.__setattr__(self, "_copy", single)
        # Its own parameter-free copy: functional_call swaps the lane's tensors into the module it
        # calls, and the lanes' threads call prototypes() at once.
        object.__setattr__(self, "_skeleton", copy.deepcopy(lanes.skeleton))
        self.i = i
        self._meeting = meeting
        self._version = version
        self._copied_at = -1
        self.train(lanes.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._meeting.meet(self.i, x, lambda xs: self._lanes(torch.stack(xs)).unbind(0))

    def prototypes(self) -> torch.Tensor:
        lanes, i = self._lanes, self.i
        tensors = {f"net.{n}": p[i] for n, p in zip(lanes.param_names, lanes.stacked)}
        tensors |= {f"net.{n}": b[i] for n, b in lanes._stacked_buffers().items()}
        return torch.func.functional_call(_Call(self._skeleton, "prototypes"), tensors, ())

    def parameters(self, recurse: bool = True):
        return self._lanes.parameters(recurse)

    def train(self, mode: bool = True) -> LaneView:
        super().train(mode)
        self._lanes.train(mode)  # every lane sets the same mode at the same point of its loop
        return self

    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        return self._lanes.lane_state_dict(self.i)

    def load_state_dict(self, state: dict[str, Any], strict: bool = True, assign: bool = False):
        self._lanes.load_lane_state_dict(self.i, state)
        self._copied_at = -1

    def single(self) -> nn.Module:
        """The lane as a network of its own, at the lane's current weights and mode."""
        if self._copied_at != self._version.steps:
            self._copy.load_state_dict(self._lanes.lane_state_dict(self.i))
            self._copied_at = self._version.steps
        return self._copy.train(self.training)

    def __deepcopy__(self, memo: dict) -> LaneView:
        def teacher(views: list[LaneView]) -> list[LaneView]:
            copies = [copy.deepcopy(v.single()) for v in views]
            frozen = Lanes(copies)
            return [LaneView(frozen, k, self._meeting, c, _Version()) for k, c in enumerate(copies)]

        return self._meeting.meet(self.i, self, teacher)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.single(), name)


def refusal(method: ContinualMethod) -> str | None:
    """Why `method` cannot run laned, or None: the method answers for itself (`lane_refusal`), and
    a step with hooks of its own is refused here as well, whatever the class says."""
    cls = type(method)
    changed = [h for h in _STEP_HOOKS if getattr(cls, h) is not getattr(ContinualMethod, h)]
    if changed:
        return f"{cls.name} changes the training step ({', '.join(changed)}): it runs alone, not laned"
    return method.lane_refusal()


def _run_differs(a: ContinualMethod, b: ContinualMethod) -> str | None:
    """The first of a run's settings (its method's options, its context's batch sizes and task
    classes) in which two lanes differ, or None: the seed (the generator) is what lanes vary."""
    for k, v in vars(a.opts).items():
        if vars(b.opts).get(k) != v:
            return f"method setting {k} ({v!r} against {vars(b.opts).get(k)!r})"
    for k in ("replay_batch_size", "eval_batch_size", "n_classes"):
        if getattr(a.ctx, k) != getattr(b.ctx, k):
            return f"{k} ({getattr(a.ctx, k)!r} against {getattr(b.ctx, k)!r})"
    if [len(t) for t in a.ctx.task_classes] != [len(t) for t in b.ctx.task_classes]:
        return "the tasks' class counts"  # which classes (a shuffled order's seed) may differ: shapes do not
    return None


def train_laned(methods: Sequence[ContinualMethod], run: Callable[[int, ContinualMethod], None]) -> None:
    """Train the runs `methods` (one per lane, each on its own network, context and generator;
    same class and settings) in lockstep: `run(i, method)` is lane i's whole single-run loop (e.g.
    `train_tasks` with its own data and observer), started in its own thread once the networks
    are stacked and every `method.net` is its lane. Afterwards each method holds a network of its
    own again, with its lane's trained state. The first lane to fail stops every lane and its
    error is raised."""
    if len({type(m) for m in methods}) != 1:
        raise ValueError("every lane must run the same method")
    for m in methods:  # a lane's own settings (PBR's imprint) may refuse where another's would not
        why = refusal(m)
        if why:
            raise ValueError(why)
    if any(m.ctx.autocast_dtype is not None for m in methods):
        # torch.autocast does not reach a laned forward's convolutions: the lanes would train in
        # fp32 beside single runs in bf16 (Lanes(compute_dtype=...) is the laned bf16, not wired here).
        raise ValueError("lanes train in fp32: a run under bf16 autocast runs alone")
    for i, m in enumerate(methods[1:], 1):
        differs = settings_differ(methods[0].net, m.net) or _run_differs(methods[0], m)
        if differs:
            raise ValueError(f"lane {i} differs from lane 0 in {differs}: the lanes of one job make the same calls "
                             "on batches of one shape (and share one optimiser), so lanes of other settings belong "
                             "in other jobs")
    lr = {m.opts.lr for m in methods}
    decay = {getattr(m.opts, "weight_decay", 0.0) for m in methods}
    singles = [m.net for m in methods]
    lanes = Lanes(singles)
    meeting = Rendezvous(len(methods))
    version = _Version()
    # Plain SGD has no state, so one optimiser for every task equals a fresh one a task.
    opt = torch.optim.SGD(lanes.parameters(), lr=lr.pop(), weight_decay=decay.pop())

    def one_step(losses: list[torch.Tensor]) -> list[torch.Tensor]:
        # At the lr the lanes' own optimisers are at (their begin_epoch follows lr_milestones): one
        # for all, as the lanes train the same epochs at the same settings.
        now = {m.opt.param_groups[0]["lr"] for m in methods}
        if len(now) != 1:
            raise ValueError(f"the lanes' optimisers are at different lrs {sorted(now)}: the lanes of one job "
                             "must train the same epochs")
        rate = now.pop()
        for group in opt.param_groups:
            group["lr"] = rate
        opt.zero_grad(set_to_none=True)
        torch.stack(losses).sum().backward()
        opt.step()
        version.steps += 1
        return [loss.detach() for loss in losses]

    errors: list[BaseException] = []
    # Each lane says itself when it is done: Thread.is_alive() is no witness after a join that a
    # signal cut short (CPython 3.11 then reads a running thread as ended).
    done = [threading.Event() for _ in methods]

    def lane(i: int, m: ContinualMethod) -> None:
        try:
            run(i, m)
        except BaseException as e:
            if not isinstance(e, LaneFailed):
                e.add_note(f"(in lane {i} of {len(methods)})")
            errors.append(e)
            meeting.abort(e)
        finally:
            meeting.leave(i)
            done[i].set()

    for i, m in enumerate(methods):
        m.net = LaneView(lanes, i, meeting, copy.deepcopy(singles[i]), version)
        m.step = lambda loss, i=i: meeting.meet(i, loss, one_step)
    threads = [threading.Thread(target=lane, args=(i, m), name=f"lane-{i}") for i, m in enumerate(methods)]
    started: list[threading.Thread] = []
    try:
        for t in threads:
            t.start()
            started.append(t)
        for d in done:
            d.wait()
    finally:
        if not all(d.is_set() for d in done):  # interrupted while waiting (Ctrl-C, a signal), or a lane not started
            meeting.abort(RuntimeError("the laned training was interrupted"))
        for i, t in enumerate(started):
            done[i].wait()
            t.join()
        for i, (m, single) in enumerate(zip(methods, singles)):
            single.load_state_dict(lanes.lane_state_dict(i))
            m.net = single
            del m.step
            if getattr(m, "opt", None) is not None:  # it held the stacked tensors
                m.opt = torch.optim.SGD(single.parameters(), lr=m.opts.lr,
                                        weight_decay=getattr(m.opts, "weight_decay", 0.0))
            # A network the method copied from its lane (PBR's teacher) becomes its own, frozen, network too.
            for name, value in list(vars(m).items()):
                if isinstance(value, LaneView):
                    setattr(m, name, value.single().requires_grad_(False))
    if errors:
        # A lane's own error, else the one the others were stopped by (the shared step's own: an
        # out-of-memory error stays one).
        own = [e for e in errors if not isinstance(e, LaneFailed)]
        raise own[0] if own else errors[0].__cause__
