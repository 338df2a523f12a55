"""Joining and splitting as torch spells them: `em.cat`, `em.stack`, `Tensor.split`,
`chunk`, `unbind` and `repeat`. A join is one `ember.concat` (its gradient: a slice per
operand); each piece of a split is one `ember.slice` (its gradient an `ember.unslice`).
"""

from __future__ import annotations

from collections.abc import Sequence

from . import context
from .context import lift
from .indexing import along
from .tensor import Tensor, _axis, implements


def _tensors(what: str, tensors) -> list[Tensor]:
    """The operands of a join as Tensors of the first traced one's dtype."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, Sequence) or not tensors:
        raise TypeError(f"{what} takes a non-empty list or tuple of tensors")
    t = context.current()
    dtype = next((x.dtype for x in tensors if isinstance(x, Tensor)), None)
    return [t.lift(x, dtype) for x in tensors]


def cat(tensors, dim: int = 0) -> Tensor:
    """torch.cat: the tensors joined along `dim`; every other dim must agree."""
    xs = _tensors("cat", tensors)
    d = _axis(xs[0], dim)
    return xs[0] if len(xs) == 1 else xs[0].trace.op("ember.concat", *xs, axis=d)


def stack(tensors, dim: int = 0) -> Tensor:
    """torch.stack: equal-shaped tensors joined along a new dim `dim`."""
    xs = _tensors("stack", tensors)
    if len({x.shape for x in xs}) > 1:
        raise xs[0].trace.error("stack: shapes " + ", ".join(str(list(x.shape)) for x in xs)
                                + " differ (stack needs equal shapes)")
    d = _axis(xs[0], dim, xs[0].ndim + 1)
    return cat([x.unsqueeze(d) for x in xs], d)


@implements
def split(x: Tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """torch.split: pieces of `split_size` along dim (the last may be smaller), or of the
    listed sizes, which must add up to the dim's size."""
    x = lift(x)
    d = _axis(x, dim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        if size < 1 and n:
            raise x.trace.error(f"split: split_size must be >= 1, got {size}")
        sizes = [min(size, n - s) for s in range(0, n, size)] if n else [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise x.trace.error(f"split: sizes {sizes} add up to {sum(sizes)}, not the {n} "
                                f"of dim {d} of {list(x.shape)}")
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return tuple(along(x, d, s, m) for s, m in zip(starts, sizes))


@implements
def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """torch.chunk: at most `chunks` pieces of ceil(size / chunks) along dim."""
    if chunks < 1:
        raise context.current().error(f"chunk: chunks must be >= 1, got {chunks}")
    x = lift(x)
    n = x.shape[_axis(x, dim)]
    return split(x, max(-(-n // chunks), 1), dim)


@implements
def unbind(x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """torch.unbind: the slices along dim, that dim removed."""
    x = lift(x)
    d = _axis(x, dim)
    return tuple(p.squeeze(d) for p in split(x, 1, d)) if x.shape[d] else ()


@implements
def repeat(x: Tensor, *sizes) -> Tensor:
    """torch's `repeat`: x tiled `sizes[i]` times along dim i (leading sizes add dims): a
    broadcast of x with a size-1 dim before each, reshaped (no op of its own)."""
    x = lift(x)
    reps = [int(s) for s in (sizes[0] if len(sizes) == 1 and not isinstance(sizes[0], int)
                             else sizes)]
    if len(reps) < x.ndim:
        raise x.trace.error(f"repeat: {len(reps)} sizes for {x.ndim} dims of {list(x.shape)} "
                            "(give at least one per dim)")
    shape = (1,) * (len(reps) - x.ndim) + tuple(x.shape)
    pairs = [n for s in shape for n in (1, s)]
    tiled = [n for r, s in zip(reps, shape) for n in (r, s)]
    y = x.reshape(pairs).expand(*tiled)
    return y.reshape([r * s for r, s in zip(reps, shape)])
