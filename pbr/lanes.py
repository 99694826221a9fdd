"""Lanes: L runs of one network trained in one process as one stacked network.

At batch 32 + 32 a GPU step is bound by kernel launches, not arithmetic (docs/benchmarks.md), so
L runs of one sweep cell (its seeds) that share an architecture and a learning rate can share
every kernel instead: parameters and buffers are stacked along a new leading lane dimension
(torch.func.stack_module_state) and one forward runs all lanes through vmap(functional_call),
which turns each convolution into one grouped convolution and each BatchNorm into one BatchNorm
over L x C channels. The lanes never mix: each has its own batch, its own parameters, its own
BatchNorm running statistics, and its own gradient, because the backward of the summed losses
gives each lane exactly the gradient of its own loss. Plain SGD (with or without weight decay or
momentum) is elementwise, so one SGD over the stacked tensors is L independent SGDs.

What stays per lane outside this module (data order, buffer, generator, the method's own
bookkeeping) is the caller's: this module only takes per-lane batches [L, B, C, H, W] and labels
[L, B] and returns per-lane losses [L].
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _lane_channels_last(t: torch.Tensor) -> torch.Tensor:
    """A stacked [L, N, C, H, W] tensor laid out so that each lane's slice, and the grouped
    [N, L*C, H, W] tensor vmap's convolution rule builds from it, is channels_last. Plain
    `channels_last_3d` would treat the lane as the batch and the batch as the channels."""
    if t.dim() != 5:
        return t
    return t.permute(1, 3, 4, 0, 2).contiguous().permute(3, 0, 4, 1, 2)


def _weight_channels_last(t: torch.Tensor) -> torch.Tensor:
    """A stacked conv weight [L, O, I, kh, kw] whose per-lane slices are channels_last."""
    if t.dim() != 5:
        return t
    return t.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)


def _to_fp32(module: nn.Module, args: tuple) -> tuple:
    return tuple(a.float() for a in args)


def _back_to(dtype: torch.dtype):
    def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        return out.to(dtype)
    return hook


class Lanes(nn.Module):
    """L copies of one network (same class and shapes, their own parameters and buffers).

    `compute_dtype=torch.bfloat16` runs the convolutions in bf16 with fp32 master weights,
    BatchNorm and the head in fp32 (the head turns autocast off itself: pbr.models.heads).
    torch.autocast cannot do this: under vmap its casts miss the convolutions (they reach the
    kernel in fp32), so the lanes cast by hand what autocast would (every parameter not owned by
    a BatchNorm or the head) once per step for all lanes.

    `channels_last=True` lays out the stacked conv weights and each step's input so that the
    grouped convolutions vmap launches get channels_last tensors.
    """

    def __init__(self, nets: Sequence[nn.Module], compute_dtype: torch.dtype | None = None,
                 channels_last: bool = False) -> None:
        super().__init__()
        if len(nets) < 1:
            raise ValueError("lanes need at least one network")
        kinds = {type(n) for n in nets}
        shapes = {tuple((k, tuple(v.shape)) for k, v in n.state_dict().items()) for n in nets}
        if len(kinds) > 1 or len(shapes) > 1:
            raise ValueError("every lane's network must have the same class and parameter shapes")
        for i, n in enumerate(nets[1:], 1):
            # The lanes run lane 0's module with their own tensors: its scale, dropout rate or eps
            # would silently be every lane's, and stacking would promote a mix of dtypes.
            differs = settings_differ(nets[0], n) or _tensors_differ(nets[0], n)
            if differs:
                raise ValueError(f"lane {i}'s network differs from lane 0's in {differs}: lanes of other "
                                 "settings belong in other jobs")
        if compute_dtype not in (None, torch.float32, torch.bfloat16):  # fp16 would need loss scaling
            raise ValueError(f"compute_dtype must be None, float32 or bfloat16, got {compute_dtype}")
        params, buffers = torch.func.stack_module_state(list(nets))
        self.param_names = tuple(params)
        self.buffer_names = tuple(buffers)
        lay = _weight_channels_last if channels_last else (lambda t: t)
        # ParameterList / numbered buffers because a module attribute's name cannot hold dots.
        self.stacked = nn.ParameterList([nn.Parameter(lay(params[n].detach())) for n in self.param_names])
        for i, n in enumerate(self.buffer_names):
            self.register_buffer(f"buffer{i}", buffers[n].detach().clone())
        # A parameter-free copy to call functionally; kept off the module tree so that
        # .parameters(), .to() and state_dict() see only the stacked tensors.
        object.__setattr__(self, "skeleton", copy.deepcopy(nets[0]).to("meta"))
        self.skeleton.train(nets[0].training)
        self.training = nets[0].training
        self.state_names = tuple(nets[0].state_dict())  # a single network's state_dict order
        bn_owned = {f"{m}.{p}" for m, mod in self.skeleton.named_modules()
                    if isinstance(mod, nn.modules.batchnorm._BatchNorm) for p, _ in mod.named_parameters(recurse=False)}
        self.cast = tuple(n not in bn_owned and not n.startswith("head.") for n in self.param_names)
        self.compute_dtype = None if compute_dtype == torch.float32 else compute_dtype
        if self.compute_dtype is not None:
            # vmap's BatchNorm rule hands the kernel affine tensors in the input's dtype beside the
            # fp32 running statistics, a mix the kernels refuse; so BatchNorm runs in fp32 (as
            # autocast's fp32 statistics would have it) between casts.
            for mod in self.skeleton.modules():
                if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                    mod.register_forward_pre_hook(_to_fp32)
                    mod.register_forward_hook(_back_to(self.compute_dtype))
        self.channels_last = channels_last

    @property
    def n_lanes(self) -> int:
        return self.stacked[0].shape[0]

    def train(self, mode: bool = True) -> Lanes:
        super().train(mode)
        self.skeleton.train(mode)
        return self

    def _stacked_buffers(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, f"buffer{i}") for i, n in enumerate(self.buffer_names)}

    def _stacked_params(self) -> dict[str, torch.Tensor]:
        dt = self.compute_dtype
        return {n: p.to(dt) if dt is not None and c else p
                for n, p, c in zip(self.param_names, self.stacked, self.cast)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [L, B, n_classes] of per-lane inputs [L, B, C, H, W]."""
        if x.dim() < 2 or x.shape[0] != self.n_lanes:
            raise ValueError(f"expected inputs [L={self.n_lanes}, B, ...], got {tuple(x.shape)}")
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        if self.channels_last:
            x = _lane_channels_last(x)

        def one(p, b, xi):
            return torch.func.functional_call(self.skeleton, (p, b), (xi,))

        # randomness="different": dropout draws each lane's mask from the global RNG, as a
        # single run's F.dropout does (lanes with dropout are alike in law, not bit for bit).
        return torch.func.vmap(one, randomness="different")(self._stacked_params(), self._stacked_buffers(), x)

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-lane mean cross-entropy [L] of inputs [L, B, ...] against labels [L, B]."""
        if y.shape[:2] != x.shape[:2]:
            raise ValueError(f"labels {tuple(y.shape)} do not match inputs {tuple(x.shape)}")
        logits = self(x)
        if logits.dtype in (torch.bfloat16, torch.float16):
            logits = logits.float()  # the loss in fp32, as autocast computes it
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)

    # --- one lane as a single run's network ------------------------------------------------------
    def lane_state_dict(self, i: int) -> dict[str, torch.Tensor]:
        """Lane i as the state_dict of a single network (what `Net.load_state_dict` takes), so a
        lane saves and resumes as a single run does."""
        self._check_lane(i)
        flat = dict(zip(self.param_names, self.stacked)) | self._stacked_buffers()
        return {n: flat[n][i].detach().clone(memory_format=torch.contiguous_format) for n in self.state_names}

    def load_lane_state_dict(self, i: int, state: dict[str, Any]) -> None:
        """Overwrite lane i with a single network's state_dict (a resumed run's)."""
        self._check_lane(i)
        if set(state) != set(self.state_names):
            missing, extra = set(self.state_names) - set(state), set(state) - set(self.state_names)
            raise ValueError(f"lane state_dict does not fit: missing {sorted(missing)[:3]}, "
                             f"unexpected {sorted(extra)[:3]}")
        flat = dict(zip(self.param_names, self.stacked)) | self._stacked_buffers()
        for n in self.state_names:
            if tuple(state[n].shape) != tuple(flat[n].shape[1:]):
                raise ValueError(f"lane {i}'s state {n!r} is {list(state[n].shape)}, the lanes hold "
                                 f"{list(flat[n].shape[1:])}: a network of another shape (another width or class count)")
        with torch.no_grad():
            for n in self.state_names:
                flat[n][i].copy_(state[n])

    def _check_lane(self, i: int) -> None:
        if not 0 <= i < self.n_lanes:
            raise IndexError(f"lane {i} out of range: there are {self.n_lanes} lanes")


def sgd(lanes: Lanes, lr: float, weight_decay: float = 0.0) -> torch.optim.SGD:
    """The methods' plain SGD (no momentum), over the stacked tensors: elementwise, hence L
    independent optimisers with the same settings; fresh per task as `begin_task` makes it."""
    return torch.optim.SGD(lanes.parameters(), lr=lr, weight_decay=weight_decay)


def step(lanes: Lanes, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One training step of every lane on its own batch; the detached per-lane losses [L]."""
    losses = lanes.losses(x, y)
    opt.zero_grad(set_to_none=True)
    # Lanes share no tensor, so d(sum)/d(lane i) is lane i's own gradient.
    losses.sum().backward()
    opt.step()
    return losses.detach()


def augment(raw: torch.Tensor, generators: Sequence[torch.Generator], mean: Sequence[float], std: Sequence[float],
            padding: int = 4) -> torch.Tensor:
    """`pbr.data.augment.Augment` for every lane at once: lane i's crops and flips are drawn from
    generators[i] exactly as `Augment()(raw[i], generators[i])` draws them (so a laned run keeps a
    single run's augmentation stream), then one gather and one normalisation serve all lanes.
    Per-lane augmentation costs some ten small kernels a lane a call; this leaves three (the draws)."""
    from pbr.data.augment import crop_flip, normalize, sample_crop_flip_params

    if raw.dim() != 5 or raw.shape[0] != len(generators):
        raise ValueError(f"expected uint8 [L={len(generators)}, B, C, H, W] and one generator a lane, "
                         f"got {tuple(raw.shape)}")
    n = raw.shape[1]
    draws = [sample_crop_flip_params(n, padding, g, raw.device) for g in generators]
    dy, dx, flip = (torch.cat(d) for d in zip(*draws))
    out = crop_flip(raw.flatten(0, 1), dy, dx, flip, padding)
    return normalize(out, mean, std).view(*raw.shape[:2], *out.shape[1:])


def settings_differ(a: nn.Module, b: nn.Module) -> str | None:
    """The first plain (non-tensor) attribute in which two networks' modules differ (a head's scale, a
    dropout rate, BatchNorm's eps), or None."""
    plain = (bool, int, float, str, tuple, type(None))
    for (name, x), (_, y) in zip(a.named_modules(), b.named_modules()):
        if type(x) is not type(y):
            return f"{name or 'the network'}'s kind"
        for k, v in vars(x).items():
            if not k.startswith("_") and k != "training" and isinstance(v, plain) and vars(y).get(k) != v:
                return f"{name + '.' if name else ''}{k} ({v!r} against {vars(y).get(k)!r})"
    return None


def _tensors_differ(a: nn.Module, b: nn.Module) -> str | None:
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        if x.dtype != y.dtype or x.device != y.device:
            return f"{k}'s dtype or device ({x.dtype} on {x.device} against {y.dtype} on {y.device})"
    return None
