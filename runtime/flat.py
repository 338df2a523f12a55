"""Flat buffers: many arrays of one dtype laid end to end, so one collective moves them all.

A data-parallel step reduces its gradients, and a sharded one (ZeRO-1, runtime/zero.py)
gathers its params, through such buffers: each array is a view of its buffer, starting
64 bytes aligned (where a kernel's own buffer would start), and the views are grouped
into consecutive segments (the loss and buffers averaged everywhere, then one segment per
owner rank), the layout the sharded collectives of runtime/distributed.py read.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

ALIGN = 64  # bytes


def aligned_array(nbytes: int, dtype: np.dtype) -> np.ndarray:
    """Zeros of `nbytes` bytes whose first element is ALIGN-byte aligned."""
    raw = np.zeros(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype)


@dataclass
class Flat:
    """One dtype's buffer and the element count of each of its segments, in order."""

    buffer: np.ndarray
    counts: list[int]


@dataclass(frozen=True)
class Item:
    """An array to place: its key, shape, dtype and segment."""

    key: Hashable
    shape: tuple[int, ...]
    dtype: np.dtype
    segment: int


def lay_out(items: list[Item], segments: int) -> tuple[list[Flat], dict[Hashable, np.ndarray]]:
    """One Flat per dtype holding `items` (within a segment in the order given), and each
    item's view in its shape."""
    by_dtype: dict[np.dtype, list[Item]] = {}
    for item in items:
        by_dtype.setdefault(np.dtype(item.dtype), []).append(item)
    flats, views = [], {}
    for dtype, group in by_dtype.items():
        group.sort(key=lambda item: item.segment)  # stable: the given order within one
        counts, starts, n = [0] * segments, [], 0
        for item in group:
            size = int(np.prod(item.shape, dtype=np.int64)) * dtype.itemsize
            padded = -(-size // ALIGN) * ALIGN // dtype.itemsize
            starts.append(n)
            n += padded
            counts[item.segment] += padded
        buffer = aligned_array(n * dtype.itemsize, dtype)
        for item, start in zip(group, starts):
            size = int(np.prod(item.shape, dtype=np.int64))
            views[item.key] = buffer[start:start + size].reshape(item.shape)
        flats.append(Flat(buffer, counts))
    return flats, views


__all__ = ["ALIGN", "Flat", "Item", "aligned_array", "lay_out"]
