"""`nn.functional.interpolate` and the `nn.Upsample` layer (torch's), as compositions:
each resized axis is one `ember.gather` with a constant index array (nearest), or two and a
weighted sum with constant weights (linear, separable: bilinear and trilinear are linear
along each axis in turn). So gradients (scatter_adds), fusion, every backend and ONNX export
come with the core ops.

The numpy side is shared with ONNX's Resize (interop/onnx_ops_resize.py): `axis_taps` turns
the source coordinate of each output position into (indices, weights), `resample` applies
them to axes of a Tensor; `torch_taps` is torch's coordinate arithmetic (its CPU
kernels', float32 unless x is f64, so that nearest picks torch's pixel at every boundary).
"""

from __future__ import annotations

import math

import numpy as np

from .. import ir
from . import context
from .module import Module
from .tensor import Tensor

# mode -> the input ranks torch accepts it for
RANKS = {"nearest": (3, 4, 5), "nearest-exact": (3, 4, 5), "linear": (3,), "bilinear": (4,),
         "trilinear": (5,)}
LINEAR = ("linear", "bilinear", "trilinear")

# ONNX's nearest_mode roundings (torch's nearest is "floor"); x.5 goes to the preferred side
ROUNDINGS = {
    "floor": np.floor,
    "ceil": np.ceil,
    "round_prefer_floor": lambda c: np.ceil(c - 0.5),
    "round_prefer_ceil": lambda c: np.floor(c + 0.5),
}


# -- one axis, in numpy ----------------------------------------------------------------------

def axis_taps(coord: np.ndarray, size: int,
              nearest: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Where each output position of an axis of `size` reads, from its source coordinate
    `coord` [out]: with `nearest` (a ROUNDINGS key) indices [out, 1] and no weights;
    without, linear interpolation's two taps, indices [out, 2] and weights [out, 2] in
    coord's dtype. Coordinates past either end clamp to it (torch's and onnxruntime's
    edge rule)."""
    coord = np.asarray(coord)
    if nearest is not None:
        index = ROUNDINGS[nearest](coord).astype(np.int64)
        return np.clip(index, 0, size - 1)[:, None], None
    c = np.clip(coord, 0, size - 1)
    lo = np.minimum(np.floor(c).astype(np.int64), size - 1)
    hi = np.minimum(lo + 1, size - 1)
    w = (c - lo).astype(coord.dtype)
    return np.stack([lo, hi], 1), np.stack([1 - w, w], 1)


def torch_taps(size: int, out: int, scale: float | None, mode: str, align_corners: bool,
               dtype) -> tuple[np.ndarray, np.ndarray | None]:
    """torch's taps for one axis resized from `size` to `out`: `scale` is the scale_factor
    given for it (its coordinates then use 1 / scale) or None (size / out); `dtype` the
    arithmetic's (float32, or float64 for f64 inputs), as torch's CPU kernels."""
    f = np.dtype(dtype).type
    i = np.arange(out).astype(dtype)
    if mode in LINEAR and align_corners:
        ratio = f(size - 1) / f(out - 1) if out > 1 else f(0)
    else:
        ratio = f(1.0 / scale) if scale else f(size) / f(out)
    if mode == "nearest":  # floor(i * ratio), the product rounded to float (floorf)
        return axis_taps((ratio * i).astype(np.float32), size, "floor")
    if mode == "nearest-exact":  # floor of the half-pixel coordinate + 0.5
        c = np.maximum(ratio * (i + f(0.5)) - f(0.5), f(0))
        return axis_taps((c + f(0.5)).astype(np.float32), size, "floor")
    if out == size:  # torch copies
        return axis_taps(np.arange(size).astype(dtype), size)
    if align_corners:
        return axis_taps(ratio * i, size)
    # ratio * (i + 0.5) - 0.5 rounded once (torch's kernels contract it to a fused multiply-add)
    c = (np.float64(ratio) * (np.arange(out) + 0.5) - 0.5).astype(dtype)
    return axis_taps(np.maximum(c, f(0)), size)


# -- traced ------------------------------------------------------------------------------------

def _merged(index: np.ndarray, weight: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """`axis_taps`' taps as (index [out], weight [out]) pairs, each tap reading the same
    element as an earlier one folded into it and those left with all-0 weights dropped."""
    if weight is None:
        return [(index[:, 0], np.ones(len(index)))]
    index, weight = index.copy(), weight.astype(np.float64)
    for k in range(1, index.shape[1]):
        for j in range(k):
            same = index[:, k] == index[:, j]
            weight[same, j] += weight[same, k]
            weight[same, k] = 0
    return [(index[:, k], weight[:, k]) for k in range(index.shape[1]) if weight[:, k].any()]


def resample(x: Tensor, taps: dict) -> Tensor:
    """x with each axis of `taps` ({axis: `axis_taps`' (index, weight)}) resampled: the axis
    moved first (a transpose), a gather per tap with its constant indices, the taps weighted
    by constants and summed; x's order restored once at the end. An axis read whole and in
    order is left alone, a tap weighted 1 everywhere is not multiplied."""
    order, y = list(range(x.ndim)), x
    for axis, (index, weight) in taps.items():
        parts = _merged(index, weight)
        if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(x.shape[axis])) and (
                parts[0][1] == 1).all():
            continue
        if order[0] != axis:
            d = order.index(axis)
            perm = [d] + [i for i in range(y.ndim) if i != d]
            y, order = y.transpose(perm), [order[i] for i in perm]
        t, total = y.trace, None
        for at, w in parts:
            g = t.op("ember.gather", y, t.lift(np.ascontiguousarray(at, np.int64)), axis=0)
            if not (w == 1).all():
                w = w.reshape(-1, *([1] * (y.ndim - 1))).astype(ir.numpy_dtype(y.dtype))
                g = g * t.constant(w)
            total = g if total is None else total + g
        y = total
    return y if order == sorted(order) else y.transpose([order.index(a) for a in range(x.ndim)])


# -- nn.functional.interpolate ------------------------------------------------------------------

def _sizes(what: str, value, kind: str) -> int | float | tuple | None:
    """`size` (positive ints) or `scale_factor` (positive finite numbers): one, or a tuple."""
    if value is None:
        return None
    many = isinstance(value, (tuple, list))
    items = list(value) if many else [value]
    if kind == "size":
        ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0
                 for v in items)
        need = "a positive integer"
    else:
        ok = all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                 and math.isfinite(v) and v > 0 for v in items)
        need = "a positive finite number"
    if not ok or not items:
        raise ValueError(f"{what} {kind} must be {need} or a tuple of them, got {value!r}")
    cast = int if kind == "size" else float
    return tuple(cast(v) for v in items) if many else cast(value)


def check_args(what: str, size, scale_factor, mode: str, align_corners) -> tuple:
    """interpolate's arguments checked (ValueError naming the bad one): (size,
    scale_factor, mode, align_corners)."""
    if mode not in RANKS:
        raise ValueError(f"{what} mode must be one of {', '.join(map(repr, RANKS))}, got "
                         f"{mode!r}")
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{what}: give exactly one of size and scale_factor, got "
                         + ("both" if size is not None else "neither"))
    if align_corners is not None and mode not in LINEAR:
        raise ValueError(f"{what} align_corners can only be set with the interpolating modes "
                         f"({', '.join(LINEAR)}), not mode {mode!r}")
    return (_sizes(what, size, "size"), _sizes(what, scale_factor, "scale_factor"), mode,
            None if align_corners is None else bool(align_corners))


def _per_axis(x: Tensor, what: str, name: str, value, n: int) -> list:
    if not isinstance(value, tuple):
        return [value] * n
    if len(value) != n:
        raise x.trace.error(f"{what}: {name} {list(value)} must give one value for each of the "
                            f"{n} spatial dims of input {list(x.shape)}")
    return list(value)


def interpolate(x, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                recompute_scale_factor=None) -> Tensor:
    """torch's F.interpolate of [N, C, L] (nearest, linear), [N, C, H, W] (nearest,
    bilinear) or [N, C, D, H, W] (nearest, trilinear) x, to `size` or by `scale_factor`
    (output size floor(in * scale)); with a scale_factor the coordinates use 1 / scale
    unless `recompute_scale_factor`. Linear modes sample at half-pixel centres clamped at
    0, or with `align_corners` corner to corner."""
    size, scale_factor, mode, align_corners = check_args("interpolate", size, scale_factor,
                                                         mode, align_corners)
    x = context.lift(x)
    if x.ndim not in RANKS[mode]:
        dims = " or ".join(f"{r}-d" for r in RANKS[mode])
        raise x.trace.error(f"interpolate: mode {mode!r} needs a {dims} input [N, C, ...], got "
                            f"{list(x.shape)}")
    if mode in LINEAR and x.dtype not in ("f16", "bf16", "f32", "f64"):
        raise x.trace.error(f"interpolate: mode {mode!r} needs a float input, got {x.dtype}")
    n, ins = x.ndim - 2, list(x.shape[2:])
    if size is not None:
        outs, scales = _per_axis(x, "interpolate", "size", size, n), [None] * n
    else:
        scales = _per_axis(x, "interpolate", "scale_factor", scale_factor, n)
        outs = [math.floor(float(s) * f) for s, f in zip(ins, scales)]
        if recompute_scale_factor:
            scales = [None] * n
    if min(outs) < 1:
        raise x.trace.error(f"interpolate: output size {outs} of input {list(x.shape)} must be "
                            "at least 1 in each spatial dim")
    dtype = np.float64 if x.dtype == "f64" else np.float32
    return resample(x, {2 + axis: torch_taps(s, o, f, mode, bool(align_corners), dtype)
                        for axis, (s, o, f) in enumerate(zip(ins, outs, scales))})


class Upsample(Module):
    """torch's nn.Upsample: `interpolate` to `size` or by `scale_factor` (checked at
    construction)."""

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.size, self.scale_factor, self.mode, self.align_corners = check_args(
            "Upsample", size, scale_factor, mode, align_corners)
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x):
        return interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                           self.recompute_scale_factor)

    def extra_repr(self) -> str:
        what = (f"size={self.size!r}" if self.scale_factor is None
                else f"scale_factor={self.scale_factor!r}")
        return (f"{what}, mode={self.mode!r}"
                + ("" if self.align_corners is None else f", align_corners={self.align_corners}"))
