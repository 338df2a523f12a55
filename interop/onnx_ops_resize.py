"""ONNX's Resize (opsets 11 to 19's attributes), lowered onto
`nn.functional.interpolate`'s sampling (frontend/resize.py): for each resized axis the
source coordinate of every output position is computed with numpy, in float32 as
onnxruntime does (so that nearest picks its pixel at every boundary), per
coordinate_transformation_mode; `axis_taps` makes it indices (nearest, rounded per
nearest_mode) or two taps and their weights (linear), and `resample` one gather per tap.
Its scales or sizes must be known at import; a scale of 1 reads its axis as it is (as
onnxruntime does, whatever the coordinate mode). Not supported (refused by name): mode
"cubic", coordinate_transformation_mode "tf_crop_and_resize", antialias,
exclude_outside, and a keep_aspect_ratio_policy other than "stretch"."""

from __future__ import annotations

import numpy as np

from ..frontend.resize import ROUNDINGS, axis_taps, resample
from .onnx_lower import tensor
from .onnx_read import Node
from .onnx_rules import attr, fail, ints, norm_axis, rule

f32 = np.float32


def _original(mode: str, i: np.ndarray, scale, size: int, out: int) -> np.ndarray:
    """The source coordinate of output positions `i` (float32) on an axis resized from
    `size` to `out` by `scale`, as onnxruntime computes it."""
    if mode == "asymmetric":
        return i / scale
    if mode == "align_corners":
        return np.zeros_like(i) if out == 1 else i * f32(size - 1) / f32(out - 1)
    if mode == "tf_half_pixel_for_nn":
        return (i + f32(0.5)) / scale
    if mode == "pytorch_half_pixel" and out == 1:
        return np.zeros_like(i)
    if mode == "half_pixel_symmetric":  # its offset in float32, the rest in float64
        adjustment = f32(out) / (scale * f32(size))
        offset = f32(size) / f32(2) * (f32(1) - adjustment)
        return (np.float64(offset) + (i + 0.5) / np.float64(scale) - 0.5).astype(f32)
    return (i + f32(0.5)) / scale - f32(0.5)


COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_half_pixel_for_nn")
DEFAULTS = {"antialias": 0, "exclude_outside": 0, "keep_aspect_ratio_policy": "stretch"}


def _check(node: Node) -> list[str]:
    out = []
    mode = attr(node, "mode", "nearest")
    if mode not in ("nearest", "linear"):
        out.append(f"mode={mode!r} is not supported (nearest and linear are)")
    coord = attr(node, "coordinate_transformation_mode", "half_pixel")
    if coord not in COORDINATES:
        out.append(f"coordinate_transformation_mode={coord!r} is not supported (ember has "
                   f"{', '.join(COORDINATES)})")
    nearest = attr(node, "nearest_mode", "round_prefer_floor")
    if nearest not in ROUNDINGS:
        out.append(f"nearest_mode={nearest!r} is not supported")
    for name, default in DEFAULTS.items():
        if attr(node, name, default) != default:
            out.append(f"{name}={attr(node, name)!r} is not supported (only {default!r})")
    return out


def _given(v) -> np.ndarray | None:
    """An optional static input: None when left out or empty."""
    return None if v is None or np.asarray(v).size == 0 else np.asarray(v)


@rule("Resize", attrs="antialias axes coordinate_transformation_mode cubic_coeff_a "
      "exclude_outside extrapolation_value keep_aspect_ratio_policy mode nearest_mode",
      static=(1, 2, 3), check=_check)
def _resize(node, x, roi=None, scales=None, sizes=None):
    x = tensor(x)
    scales, sizes = _given(scales), _given(sizes)
    if (scales is None) == (sizes is None):
        raise fail(node, "exactly one of its scales and sizes inputs must be given")
    axes = attr(node, "axes")
    axes = list(range(x.ndim)) if axes is None else [norm_axis(node, a, x.ndim) for a in axes]
    given = ints(sizes) if sizes is not None else [float(s) for s in scales.reshape(-1)]
    if len(given) != len(axes):
        raise fail(node, f"{'sizes' if sizes is not None else 'scales'} {given} must give one "
                         f"value for each of the {len(axes)} axes {axes} of input "
                         f"{list(x.shape)}")
    linear = attr(node, "mode", "nearest") == "linear"
    if linear and x.dtype not in ("f16", "bf16", "f32", "f64"):
        raise fail(node, f"mode 'linear' needs a float input, got {x.dtype}")
    coord = attr(node, "coordinate_transformation_mode", "half_pixel")
    nearest = attr(node, "nearest_mode", "round_prefer_floor")
    taps = {}
    for axis, g in zip(axes, given):
        size = x.shape[axis]
        if sizes is not None:
            out, scale = int(g), f32(g) / f32(size)
        else:
            scale = f32(g)
            out = int(np.floor(scale * f32(size)))
        if out < 1 or not scale > 0:
            raise fail(node, f"axis {axis} of input {list(x.shape)} resized to {out} (scale "
                             f"{float(scale)}): sizes and scales must be positive")
        if scale == 1:
            continue
        c = _original(coord, np.arange(out, dtype=f32), scale, size, out)
        taps[axis] = axis_taps(c, size, None if linear else nearest)
    return resample(x, taps)
