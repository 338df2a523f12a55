"""The pools of `nn.functional` (torch's arguments), re-exported by frontend/functional.py:
max and average pools over 1, 2 and 3 spatial dims, and the adaptive ones.

The core ops pool 2-d windows without dilation; a 1-d pool is a 2-d one over H = 1, a 3-d
one pools the H, W planes of each depth (D folded into the channels, a free reshape), then
along D. What they cannot express (dilation, ceil_mode's extra windows, torch's indices,
adaptive windows) is a window reduction along one axis at a time of a gather of the taps
(`windows.gathered`), so autodiff, every backend and ONNX export need nothing of their own.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from .config import positive
from .ops import _t, where
from .tensor import Tensor
from .windows import HOW_MANY, batched, const, gathered, ntuple, to_axis

Taps = tuple[np.ndarray, np.ndarray]  # input positions [out, k] of windows, and which are inside


@dataclass(frozen=True)
class PoolWindows:
    """The windows of a pool over n spatial dims as torch defines them; `of` checks the
    arguments."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    ceil_mode: bool = False

    @classmethod
    def of(cls, what: str, kernel_size, stride=None, padding=0, dilation=1,
           ceil_mode: bool = False, n: int = 2) -> PoolWindows:
        kernel = ntuple(f"{what} kernel_size", kernel_size, n)
        stride = kernel if stride is None else ntuple(f"{what} stride", stride, n)
        pad = ntuple(f"{what} padding", padding, n, lo=0)
        dil = ntuple(f"{what} dilation", dilation, n)
        if any(2 * p > d * (k - 1) + 1 for p, k, d in zip(pad, kernel, dil)):
            raise ValueError(f"{what} padding {pad} must be at most half the kernel {kernel}"
                             + (f" (dilation {dil})" if set(dil) != {1} else ""))
        return cls(kernel, stride, pad, dil, bool(ceil_mode))

    @classmethod
    def uniform(cls, kernel: tuple[int, ...]) -> PoolWindows:
        """Windows that tile the input (adaptive pools whose sizes divide)."""
        return cls(kernel, kernel, (0,) * len(kernel), (1,) * len(kernel))

    def counts(self, spatial) -> list[int]:
        """torch's pooled sizes of dims `spatial` (0 where the kernel does not fit): with
        ceil_mode one more window where it would start inside the input or its left
        padding."""
        sizes = []
        for size, k, s, p, d in zip(spatial, self.kernel, self.stride, self.padding,
                                    self.dilation):
            span = size + 2 * p - d * (k - 1) - 1
            n = (span + (s - 1 if self.ceil_mode else 0)) // s + 1
            if self.ceil_mode and (n - 1) * s >= size + p:
                n -= 1
            sizes.append(n if span >= 0 else 0)
        return sizes

    def out(self, what: str, x: Tensor) -> tuple[int, ...]:
        """The pooled sizes of x [N, C, ...], which must be at least one."""
        sizes = self.counts(x.shape[2:])
        if min(sizes) < 1:
            raise x.trace.error(f"{what}: kernel {self.kernel} (dilation {self.dilation}) "
                                f"does not fit input {list(x.shape)} padded by {self.padding}")
        return tuple(sizes)

    def taps(self, axis: int, size: int, out: int) -> Taps:
        """Input positions [out, k] of the windows' taps along spatial `axis`, and whether
        each lies inside the input."""
        k, s, p, d = self.kernel[axis], self.stride[axis], self.padding[axis], self.dilation[axis]
        pos = np.arange(out)[:, None] * s - p + np.arange(k) * d
        return pos, (pos >= 0) & (pos < size)

    def all_taps(self, x: Tensor, outs: tuple[int, ...]) -> list[Taps]:
        """The taps along each spatial axis of x [N, C, ...] pooled to sizes `outs`."""
        return [self.taps(a, size, o) for a, (size, o) in enumerate(zip(x.shape[2:], outs))]

    def core(self, spatial) -> bool:
        """Whether the core 2-d pool op (floor sizes, no dilation) computes these windows
        over dims of sizes `spatial`."""
        if len(self.kernel) != 2 or self.dilation != (1, 1):
            return False
        return not self.ceil_mode or self.counts(spatial) == replace(
            self, ceil_mode=False).counts(spatial)

    def attrs(self) -> dict:
        return {"kernel": list(self.kernel), "stride": list(self.stride),
                "padding": list(self.padding)}

    def lifted(self) -> PoolWindows:
        """A 1-d pool's windows as a 2-d pool's over H = 1."""
        return PoolWindows((1, *self.kernel), (1, *self.stride), (0, *self.padding),
                           (1, *self.dilation), self.ceil_mode)

    def plane(self) -> PoolWindows:
        """A 3-d pool's windows over H and W."""
        return PoolWindows(self.kernel[1:], self.stride[1:], self.padding[1:],
                           self.dilation[1:], self.ceil_mode)


def _lifted(x: Tensor, fn):
    """fn of [N, C, L] x as [N, C, 1, L], its results back to [N, C, L']."""
    def drop(y: Tensor) -> Tensor:
        return y.reshape(*y.shape[:2], y.shape[3])

    out = fn(x.reshape(x.shape[0], x.shape[1], 1, x.shape[2]))
    return tuple(drop(y) for y in out) if isinstance(out, tuple) else drop(out)


def _planes(x: Tensor, fn) -> Tensor:
    """fn of [N, C, D, H, W] x as the 2-d planes [N, C * D, H, W], back to [N, C, D, ...]."""
    n, c, d = x.shape[:3]
    y = fn(x.reshape(n, c * d, *x.shape[3:]))
    return y.reshape(n, c, d, *y.shape[2:])


def _identity(taps: Taps, size: int) -> bool:
    pos, valid = taps
    return pos.shape == (size, 1) and valid.all() and (pos[:, 0] == np.arange(size)).all()


def _window_max(x: Tensor, axis: int, taps: Taps, index: Tensor | None):
    """The max over windows along `axis` and, given `index` (each element's flat index into
    its input plane), the index of each window's first max: the smallest index among its
    maxima, torch's row-major first. Reduced with the windows first, moved back after."""
    g = gathered(x, axis, *taps, -math.inf)
    m = g.amax(1, keepdim=True)
    y = to_axis(m.reshape(m.shape[:1] + m.shape[2:]), 1, axis)
    if index is None:
        return y, None
    negated = where(g == m, -gathered(index, axis, *taps, 0), -(2 ** 62))
    return y, to_axis(-negated.amax(1), 1, axis)


def _separable_max(x: Tensor, taps: list[Taps], return_indices: bool):
    """Window maxima along each spatial axis in turn, last first; with `return_indices`
    also each max's flat index into its input plane (torch's). These split the gradient
    among tied maxima, the core op gives it to the first."""
    spatial = x.shape[2:]
    index = x.trace.lift(np.arange(math.prod(spatial), dtype=np.int64).reshape(
        1, 1, *spatial)) if return_indices else None
    for axis in reversed(range(len(spatial))):
        if not _identity(taps[axis], spatial[axis]):
            x, index = _window_max(x, 2 + axis, taps[axis], index)
    return (x, index) if return_indices else x


def _max_pool(x: Tensor, win: PoolWindows, return_indices: bool, what: str):
    """Max pooling: the core op where it fits (the planes' of a 3-d pool, then the max
    along D), else separable window maxima of gathers."""
    if len(win.kernel) == 1:
        win.out(what, x)  # the 1-d sizes checked before lifting
        return _lifted(x, lambda x4: _max_pool(x4, win.lifted(), return_indices, what))
    if not return_indices and win.core(x.shape[2:]):
        return x.trace.op("ember.max_pool2d", x, **win.attrs())
    outs = win.out(what, x)
    if not return_indices and len(win.kernel) == 3:
        y = _planes(x, lambda x4: _max_pool(x4, win.plane(), False, what))
        taps = win.taps(0, x.shape[2], outs[0])
        return y if _identity(taps, x.shape[2]) else _window_max(y, 2, taps, None)[0]
    return _separable_max(x, win.all_taps(x, outs), return_indices)


def _max_pools(n: int, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    what = f"max_pool{n}d"
    x, win = _t(x), PoolWindows.of(what, kernel_size, stride, padding, dilation, ceil_mode, n)
    return batched(what, x, n + 2, lambda xb: _max_pool(xb, win, bool(return_indices), what))


def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max over windows of [N, C, L] or [C, L] x, torch's arguments (see max_pool2d)."""
    return _max_pools(1, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max over windows of [N, C, H, W] or [C, H, W] x, torch's arguments (stride defaults
    to the kernel; padding never wins); `return_indices` adds each max's flat index into
    its input plane (i64), as torch's."""
    return _max_pools(2, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool3d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max over windows of [N, C, D, H, W] or [C, D, H, W] x, torch's arguments; the
    indices are flat into each D x H x W volume, as torch's."""
    return _max_pools(3, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def _avg_divisor(win: PoolWindows, x: Tensor, outs: tuple[int, ...], count_include_pad: bool,
                 divisor_override: int | None) -> np.ndarray:
    """torch's divisor of each window [OD, OH, OW]: `divisor_override`, else its taps inside
    the input or, with `count_include_pad`, inside the padded input (ceil_mode's extra taps
    never count)."""
    if divisor_override is not None:
        return np.full(outs, float(divisor_override))
    counts = []
    for axis, out in enumerate(outs):
        pos, valid = win.taps(axis, x.shape[2 + axis], out)
        padded = pos < x.shape[2 + axis] + win.padding[axis]
        counts.append((padded if count_include_pad else valid).sum(1))
    return functools.reduce(np.multiply.outer, counts)


def _avg_pool(x: Tensor, win: PoolWindows, count_include_pad: bool,
              divisor_override: int | None, what: str) -> Tensor:
    """Window sums over the divisor: the core op (which divides by the kernel area)
    rescaled where it fits (the planes' of a 3-d pool, then sums along D), else separable
    window sums of gathers."""
    if len(win.kernel) == 1:
        win.out(what, x)  # the 1-d sizes checked before lifting
        return _lifted(x, lambda x4: _avg_pool(x4, win.lifted(), count_include_pad,
                                               divisor_override, what))
    y, axes, area = x, range(len(win.kernel)), 1
    if win.core(x.shape[2:]):  # the op checks the sizes
        y, axes, area = x.trace.op("ember.avg_pool2d", x, **win.attrs()), (), math.prod(win.kernel)
    outs = win.out(what, x)
    divisor = _avg_divisor(win, x, outs, count_include_pad, divisor_override)
    if axes and len(outs) == 3 and win.plane().core(x.shape[3:]):
        plane = win.plane()
        y = _planes(x, lambda x4: x4.trace.op("ember.avg_pool2d", x4, **plane.attrs()))
        axes, area = (0,), math.prod(plane.kernel)
    for axis in reversed(axes):
        taps = win.taps(axis, x.shape[2 + axis], outs[axis])
        if not _identity(taps, x.shape[2 + axis]):
            y = to_axis(gathered(y, 2 + axis, *taps, 0.0).sum(1), 1, 2 + axis)
    scale = divisor / area
    return y if (scale == 1).all() else y / const(x, scale)


def _avg_pools(n: int, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
               divisor_override) -> Tensor:
    what = f"avg_pool{n}d"
    x, win = _t(x), PoolWindows.of(what, kernel_size, stride, padding, ceil_mode=ceil_mode, n=n)
    if divisor_override is not None:
        positive(f"{what} divisor_override", divisor_override)
    return batched(what, x, n + 2, lambda xb: _avg_pool(xb, win, bool(count_include_pad),
                                                        divisor_override, what))


def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """Mean over windows of [N, C, L] or [C, L] x, torch's arguments (no divisor_override,
    as torch's)."""
    return _avg_pools(1, x, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """Mean over windows of [N, C, H, W] or [C, H, W] x, torch's arguments: zero padding is
    counted unless `count_include_pad=False`; `divisor_override` replaces the count."""
    return _avg_pools(2, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                      divisor_override)


def avg_pool3d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """Mean over windows of [N, C, D, H, W] or [C, D, H, W] x, torch's arguments (see
    avg_pool2d)."""
    return _avg_pools(3, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                      divisor_override)


# -- adaptive pools ---------------------------------------------------------------------------

def output_sizes(name: str, output_size, n: int) -> tuple[int | None, ...]:
    """torch's adaptive output_size: an int, or n of them where None keeps the input's."""
    if isinstance(output_size, (tuple, list)) and len(output_size) == n:
        return tuple(None if o is None else ntuple(name, o, 1)[0] for o in output_size)
    try:
        return ntuple(name, output_size, n)
    except ValueError:
        raise ValueError(f"{name} must be an integer >= 1 or {HOW_MANY[n]} of them (None "
                         f"keeps the input's size), got {output_size!r}") from None


def _adaptive_taps(size: int, out: int) -> Taps:
    """Window i covers [floor(i*size/out), ceil((i+1)*size/out)) (PyTorch's): the longest
    window's count of taps, the shorter ones' last marked outside."""
    i = np.arange(out)
    lo, hi = i * size // out, -(-(i + 1) * size // out)
    pos = lo[:, None] + np.arange((hi - lo).max())
    return pos, pos < hi[:, None]


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """[out, size]: row i averages PyTorch's adaptive window i."""
    pos, valid = _adaptive_taps(size, out)
    m = np.zeros((out, size))
    for row, (p, v) in enumerate(zip(pos, valid)):
        m[row, p[v]] = 1.0 / v.sum()
    return m


def _adaptive(what: str, x, output_size, n: int, pool) -> Tensor | tuple:
    """`pool(x, sizes, what)` on [N, C, ...] or unbatched x, torch's checks of
    output_size and of the input."""
    x, sizes = _t(x), output_sizes(f"{what} output_size", output_size, n)

    def run(xb: Tensor):
        if 0 in xb.shape[1:]:  # no window to pool (torch's check too)
            raise xb.trace.error(f"{what}: input {list(xb.shape)} is empty in a non-batch "
                                 "dimension")
        return pool(xb, tuple(s if o is None else o for s, o in zip(xb.shape[2:], sizes)), what)

    return batched(what, x, n + 2, run)


def _adaptive_avg(x: Tensor, outs: tuple[int, ...], what: str) -> Tensor:
    """One average pool when the sizes divide, else a constant averaging matmul per axis."""
    if all(size % o == 0 for size, o in zip(x.shape[2:], outs)):
        win = PoolWindows.uniform(tuple(size // o for size, o in zip(x.shape[2:], outs)))
        return _avg_pool(x, win, True, None, what)
    dtype = np.dtype("f8") if x.dtype == "f64" else np.dtype("f4")
    for axis, out in enumerate(outs, 2):
        size, rest = x.shape[axis], x.shape[axis + 1:]
        if size == out:
            continue
        m = _adaptive_matrix(size, out).astype(dtype)
        if not rest:
            x = x @ x.trace.lift(m.T, x.dtype)
        else:
            x = (x.trace.lift(m, x.dtype) @ x.reshape(*x.shape[:axis], size, math.prod(rest))
                 ).reshape(*x.shape[:axis], out, *rest)
    return x


def _adaptive_max(x: Tensor, outs: tuple[int, ...], what: str, return_indices: bool = False):
    """One max pool when the sizes divide, else separable maxima of adaptive windows."""
    if not return_indices and all(size % o == 0 for size, o in zip(x.shape[2:], outs)):
        win = PoolWindows.uniform(tuple(size // o for size, o in zip(x.shape[2:], outs)))
        return _max_pool(x, win, False, what)
    taps = [_adaptive_taps(size, o) for size, o in zip(x.shape[2:], outs)]
    return _separable_max(x, taps, return_indices)


def adaptive_avg_pool1d(x, output_size) -> Tensor:
    """Mean over PyTorch's adaptive windows of [N, C, L] or [C, L] x."""
    return _adaptive("adaptive_avg_pool1d", x, output_size, 1, _adaptive_avg)


def adaptive_avg_pool2d(x, output_size) -> Tensor:
    """Mean over PyTorch's adaptive windows of [N, C, H, W] or [C, H, W] x, to a fixed
    output size (None keeps a dim's size)."""
    return _adaptive("adaptive_avg_pool2d", x, output_size, 2, _adaptive_avg)


def adaptive_avg_pool3d(x, output_size) -> Tensor:
    """Mean over PyTorch's adaptive windows of [N, C, D, H, W] or [C, D, H, W] x."""
    return _adaptive("adaptive_avg_pool3d", x, output_size, 3, _adaptive_avg)


def adaptive_max_pool1d(x, output_size, return_indices: bool = False):
    """Max over PyTorch's adaptive windows of [N, C, L] or [C, L] x; `return_indices` adds
    each max's index along L."""
    return _adaptive("adaptive_max_pool1d", x, output_size, 1, functools.partial(
        _adaptive_max, return_indices=bool(return_indices)))


def adaptive_max_pool2d(x, output_size, return_indices: bool = False):
    """Max over PyTorch's adaptive windows of [N, C, H, W] or [C, H, W] x; `return_indices`
    adds each max's flat index into its input plane."""
    return _adaptive("adaptive_max_pool2d", x, output_size, 2, functools.partial(
        _adaptive_max, return_indices=bool(return_indices)))


def adaptive_max_pool3d(x, output_size, return_indices: bool = False):
    """Max over PyTorch's adaptive windows of [N, C, D, H, W] or [C, D, H, W] x;
    `return_indices` adds each max's flat index into its D x H x W volume."""
    return _adaptive("adaptive_max_pool3d", x, output_size, 3, functools.partial(
        _adaptive_max, return_indices=bool(return_indices)))
