"""Element-stride arithmetic on static shapes, shared by the CPU and CUDA code generators:
both index every buffer as a sum of coordinate * stride."""

from __future__ import annotations

from collections.abc import Sequence

Dim = tuple[int, tuple[int, ...]]  # (size, one element stride per buffer)


def cdiv(a: int, b: int) -> int:
    """a / b rounded up (blocks, tiles, chunks of a size)."""
    return -(-a // b)


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a contiguous `shape` read at `out_shape`: 0 where it broadcasts."""
    lead = len(out_shape) - len(shape)
    return tuple([0] * lead + [0 if d == 1 else s
                               for d, s in zip(shape, contiguous_strides(shape))])


def collapse(dims: Sequence[Dim]) -> list[Dim]:
    """Drop size-1 dimensions and merge neighbours that every buffer walks contiguously,
    so `x + y` on equal shapes is one flat loop and a bias add is two."""
    out: list[Dim] = []
    for size, strides in dims:
        if size == 1:
            continue
        if out and all(so == s * size for so, s in zip(out[-1][1], strides)):
            out[-1] = (out[-1][0] * size, tuple(strides))
        else:
            out.append((size, tuple(strides)))
    return out
