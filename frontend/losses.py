"""The losses of `nn.functional` (cross_entropy, nll_loss, mse_loss,
binary_cross_entropy_with_logits) with torch's reduction, weight and ignore_index
arguments. Re-exported by frontend/functional.py.
"""
from __future__ import annotations

from .ops import _t, log_softmax, softplus
from .tensor import Tensor

# -- losses ----------------------------------------------------------------------------

def _class_last(x: Tensor) -> Tensor:
    """[N, C, d1, ...] as [N, d1, ..., C]: the class axis where one_hot puts it, so that
    spatial inputs are per-position classifications with no reshape of the labels."""
    return x if x.ndim <= 2 else x.transpose([0, *range(2, x.ndim), 1])


def _labels(scores: Tensor, labels: Tensor, what: str) -> None:
    """Class scores [N, C, d1, ...] must have labels [N, d1, ...] (torch's spatial targets)."""
    want = scores.shape[:1] + scores.shape[2:]
    if scores.ndim < 2 or labels.shape != want:
        raise scores.trace.error(f"{what}: input {list(scores.shape)} and target "
                                 f"{list(labels.shape)} disagree (want [N, C, d1, ...] and "
                                 "[N, d1, ...])")


def _one_hot(labels: Tensor, num_classes: int, dtype: str) -> Tensor:
    return labels.trace.op("ember.one_hot", labels, num_classes=num_classes, dtype=dtype)


REDUCTIONS = ("mean", "sum", "none")


def _reduced(losses: Tensor, reduction: str, weights: Tensor | None = None) -> Tensor:
    """Per-sample `losses` as `reduction` asks (torch's names); with per-sample `weights`
    the mean is the weighted mean, sum(w l) / sum(w), as torch's class weights give."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if weights is not None:
        losses = losses * weights
    if reduction == "none":
        return losses
    if reduction == "sum" or weights is None:
        return losses.sum() if reduction == "sum" else losses.mean()
    return losses.sum() / weights.sum()


def _class_weights(weight, labels_one_hot: Tensor) -> Tensor | None:
    """Each sample's class weight (weight[target[i]]), from a [C] tensor or array."""
    if weight is None:
        return None
    w = _t(weight)
    c = labels_one_hot.shape[-1]
    if w.shape != (c,):
        raise w.trace.error(f"weight must have one value per class, [{c}], got {list(w.shape)}")
    return (labels_one_hot * w).sum(-1)


def _sample_weights(labels: Tensor, hot: Tensor, weight, ignore_index: int) -> Tensor:
    """Per-sample weights: the class weight of each label, times 0 where the label is
    `ignore_index` (torch's: an ignored sample counts neither in the sum nor in the mean;
    the runtime's label check lets that value through)."""
    weights = _class_weights(weight, hot)
    keep = (labels != ignore_index).astype(hot.dtype)
    return keep if weights is None else weights * keep


def cross_entropy(logits, target, label_smoothing: float = 0.0, weight=None,
                  reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """Cross-entropy of logits [N, C, d1, ...] against integer labels [N, d1, ...] or class
    probabilities shaped as the logits, with PyTorch's label smoothing, class `weight` [C],
    `ignore_index` (integer labels) and `reduction` ("mean", "sum", "none")."""
    logits, target = _t(logits), _t(target)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
    integer = target.dtype in ("i32", "i64")
    weights = None
    if integer:
        _labels(logits, target, "cross_entropy")
        c = logits.shape[1]
        if logits.ndim == 2 and label_smoothing == 0 and weight is None and reduction == "mean":
            return logits.trace.op("nn.cross_entropy", logits, target, ignore_index=ignore_index)
        labels, target = target, _one_hot(target, c, logits.dtype)
        weights = _sample_weights(labels, target, weight, ignore_index)
    elif target.shape != logits.shape or logits.ndim < 2:
        raise logits.trace.error(f"cross_entropy: logits {list(logits.shape)} and target "
                                 f"probabilities {list(target.shape)} disagree (want both "
                                 "[N, C, d1, ...])")
    else:
        target = _class_last(target)
    if weight is not None and (not integer or label_smoothing):
        raise logits.trace.error("cross_entropy: weight= is supported for integer labels "
                                 "without label smoothing")
    if label_smoothing:
        target = target * (1.0 - label_smoothing) + label_smoothing / logits.shape[1]
    logp = log_softmax(_class_last(logits), -1)
    return _reduced(-(target * logp).sum(-1), reduction, weights)


def nll_loss(log_probs, target, weight=None, reduction: str = "mean",
             ignore_index: int = -100) -> Tensor:
    """-log_probs[i, target[i]] over log-probabilities [N, C, d1, ...] and labels
    [N, d1, ...], with class `weight` [C], `ignore_index` and `reduction` as torch's."""
    log_probs, target = _t(log_probs), _t(target)
    _labels(log_probs, target, "nll_loss")
    hot = _one_hot(target, log_probs.shape[1], log_probs.dtype)
    losses = -(hot * _class_last(log_probs)).sum(-1)
    return _reduced(losses, reduction, _sample_weights(target, hot, weight, ignore_index))


def mse_loss(a, b, reduction: str = "mean") -> Tensor:
    """The squared difference, reduced as torch's `reduction` says."""
    d = _t(a) - _t(b)
    return _reduced(d * d, reduction)


def binary_cross_entropy_with_logits(logits, target, pos_weight=None,
                                     reduction: str = "mean") -> Tensor:
    """max(x, 0) - x*t + log(1 + exp(-|x|)), stable for any logit; with `pos_weight` (per
    class, broadcast over the last axis) the positive term is weighted, as torch's:
    (1 - t) x + (1 + (pos_weight - 1) t) softplus(-x)."""
    x, y = _t(logits), _t(target)
    if pos_weight is None:
        return _reduced(x.relu() - x * y + (1.0 + (-x.abs()).exp()).log(), reduction)
    log_weight = (_t(pos_weight) - 1.0) * y + 1.0
    return _reduced((1.0 - y) * x + log_weight * softplus(-x), reduction)
