"""MC-dropout uncertainty (BALD mutual information) with the head sampled (and optionally the
backbone's last feature map, mc_features).

Dropout sits right before the classifier, so the backbone feature is computed once and the T
stochastic passes reduce to T masked copies of one [B, D] embedding: one [T*B, D] matmul.
Masks are drawn from an explicit generator, so scores are reproducible.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pbr.models.net import Net
from pbr.rng import check_generator


def mc_probs(
    net: Net,
    feats: torch.Tensor,
    T: int,
    tau: float,
    generator: torch.Generator,
    classes: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(logits / tau) under T independent head-dropout masks: [T, B, C'].

    Same rate and 1/(1-p) scaling as nn.Dropout. `classes` (LongTensor) restricts the softmax
    to those columns, in that order (e.g. the classes seen so far). `feats` is one [B, D] feature
    for every pass, or [T, B, D], one per pass (backbone dropout: mc_features).
    """
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if feats.dim() != 2 and not (feats.dim() == 3 and feats.shape[0] == T):
        raise ValueError(f"feats must be [B, D] or [T, B, D], got shape {tuple(feats.shape)}")
    head = net.head
    z = head.embed(feats)
    B, D = z.shape[-2:]
    if head.p > 0:
        check_generator(generator, z.device)
        keep = torch.rand((T, B, D), generator=generator, device=z.device, dtype=z.dtype) >= head.p
        z_t = (z.unsqueeze(0) if z.dim() == 2 else z) * keep * (1.0 / (1.0 - head.p))
    else:
        z_t = z.unsqueeze(0).expand(T, B, D) if z.dim() == 2 else z
    logits = head.project(z_t.reshape(T * B, D)).reshape(T, B, -1)
    if classes is not None:
        logits = logits.index_select(-1, classes.to(logits.device))
    return torch.softmax(logits / tau, dim=-1)


def mc_features(net: Net, fmap: torch.Tensor, T: int, p: float, generator: torch.Generator) -> torch.Tensor:
    """The pooled feature under T independent dropout masks on the backbone's last feature map
    [B, C, H, W] (rate p, 1/(1-p) scaling as nn.Dropout): [T, B, C]. Every layer before that map is
    deterministic in eval mode, so the T passes share one backbone pass; the masks are drawn one
    pass at a time ([B, C, H, W] each) to keep the memory of one map."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p must be in [0, 1), got {p}")
    if p == 0.0:
        return net.backbone.pool(fmap).unsqueeze(0).expand(T, -1, -1)
    check_generator(generator, fmap.device)
    passes = []
    for _ in range(T):
        keep = torch.rand(fmap.shape, generator=generator, device=fmap.device, dtype=fmap.dtype) >= p
        passes.append(net.backbone.pool(fmap * keep * (1.0 / (1.0 - p))))
    return torch.stack(passes)


def predictive_entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy over the last dim, with 0 * log 0 = 0."""
    return -torch.special.xlogy(p, p).sum(-1)


def mutual_information(probs_T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BALD from [T, B, C] probabilities: (MI [B], predictive entropy [B]).

    MI = H[mean_t p_t] - mean_t H[p_t], clamped at 0 against rounding.
    """
    if probs_T.dim() != 3:
        raise ValueError(f"probs_T must be [T, B, C], got shape {tuple(probs_T.shape)}")
    entropy = predictive_entropy(probs_T.mean(0))
    expected = predictive_entropy(probs_T).mean(0)
    return (entropy - expected).clamp_min(0.0), entropy


def score_images(
    net: Net,
    images_uint8: torch.Tensor,
    T: int,
    tau: float,
    batch_size: int,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    generator: torch.Generator,
    classes: torch.Tensor | None = None,
    dropout: float | None = None,
    backbone: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(MI [N], entropy [N]) of every image, on the net's device.

    The backbone runs in eval mode (BN uses running statistics); only the head is sampled, at the
    head's own dropout rate or at `dropout` (see score_and_predict), and with `backbone` the last
    feature map too, at the same rate (mc_features).
    Images move to the net's device batch by batch, as uint8, before `preprocess`.
    """
    mi, ent, _ = score_and_predict(net, images_uint8, T, tau, batch_size, preprocess, generator, classes, dropout,
                                   backbone)
    return mi, ent


def score_and_predict(
    net: Net,
    images_uint8: torch.Tensor,
    T: int,
    tau: float,
    batch_size: int,
    preprocess: Callable[[torch.Tensor], torch.Tensor],
    generator: torch.Generator,
    classes: torch.Tensor | None = None,
    dropout: float | None = None,
    backbone: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """score_images plus the deterministic prediction (dropout off, argmax over `classes`, as
    original class indices). `dropout` overrides the head's rate for the MC passes only (MC
    dropout on a network trained without dropout). `backbone`: the passes drop elements of the
    backbone's last feature map as well, at the same rate, drawn before the head's masks."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(net.parameters()).device
    was_training = net.training
    saved_p = net.head.p
    net.eval()
    mis, ents, preds = [], [], []
    try:
        with torch.inference_mode():
            for start in range(0, images_uint8.shape[0], batch_size):
                x = images_uint8[start : start + batch_size].to(device, non_blocking=True)
                fmap = net.backbone.feature_map(preprocess(x)) if backbone else None
                feats = net.features(preprocess(x)) if fmap is None else net.backbone.pool(fmap)
                logits = net.classify(feats)
                if classes is not None:
                    pred = classes.to(device)[logits.index_select(1, classes.to(device)).argmax(1)]
                else:
                    pred = logits.argmax(1)
                if dropout is not None:
                    net.head.p = dropout
                if fmap is not None:
                    feats = mc_features(net, fmap, T, net.head.p, generator)
                probs = mc_probs(net, feats, T, tau, generator, classes)
                net.head.p = saved_p
                mi, ent = mutual_information(probs)
                mis.append(mi)
                ents.append(ent)
                preds.append(pred)
    finally:
        net.head.p = saved_p
        net.train(was_training)
    if not mis:
        empty = torch.empty(0, device=device)
        return empty, empty.clone(), torch.empty(0, dtype=torch.int64, device=device)
    return torch.cat(mis), torch.cat(ents), torch.cat(preds)
