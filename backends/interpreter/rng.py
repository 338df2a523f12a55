"""The counter-based generator behind `ember.dropout`: the definition every backend matches.

    mix(x): x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
    index = 0; for each axis k in order: index = mix(index ^ c_k)          (uint32, wrapping)
    h = mix(seed32 ^ mix(key32 ^ mix(step32 ^ index)))
    u = (h >> 8) * 2**-24;  keep = u >= p;  y = keep ? x / (1 - p) : 0

c_k is the element's coordinate along axis k (its low 32 bits), the first one offset by
shard * rows: shard is the `rng` operand's high 32 bits (rng >> 32), rows the result's
first dimension, so a data-parallel rank (its rank as the shard) draws, for its slice of
the global batch, the mask one process would draw for those rows. seed32, key32, step32
are the low 32 bits of the op's `seed`, `key` and the `rng` operand (the step counter).
The mask depends on an element's coordinates, not on the other axes' sizes: a graph
padded to a bucket (runtime/dynamic.py) draws, at every real position, the mask an exact
compile draws. `1 - p` is computed in float64 and rounded to x's dtype before the
division. Equivalently, in integers: keep = (h >> 8) >= ceil(p * 2**24).
"""

from __future__ import annotations

import numpy as np

_MASK = 0xFFFFFFFF


def mix32(x: np.ndarray) -> np.ndarray:
    """The 32-bit integer finalizer (lowbias32), elementwise on uint32."""
    x = np.asarray(x, dtype=np.uint32)
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def coordinate_hash(coords, rows: int, step: int | np.ndarray) -> np.ndarray:
    """The index of elements at `coords` (one array per axis, broadcasting together), in a
    result whose first dimension is `rows`, for the `rng` operand `step` (its shard)."""
    index = np.uint32(0)
    for k, c in enumerate(coords):
        c = np.asarray(c).astype(np.int64)
        if k == 0:
            c = c + (np.asarray(step).astype(np.int64) >> 32) * rows
        index = mix32(index ^ c.astype(np.uint64).astype(np.uint32))
    return np.asarray(index, np.uint32)


def hash_of(index: np.ndarray, seed: int, key: int, step) -> np.ndarray:
    """h of elements whose coordinates hash to `index`."""
    s, k = (np.uint32(int(v) & _MASK) for v in (seed, key))
    t = np.asarray(step).astype(np.uint64).astype(np.uint32)
    return mix32(s ^ mix32(k ^ mix32(t ^ index)))


def dropout_hash(shape, seed: int, key: int, step: int) -> np.ndarray:
    """h (uint32) for every element of a tensor of `shape`."""
    shape = tuple(shape)
    coords = [np.arange(n).reshape((n,) + (1,) * (len(shape) - k - 1))
              for k, n in enumerate(shape)]
    index = coordinate_hash(coords, shape[0] if shape else 0, step)
    return np.broadcast_to(hash_of(index, seed, key, step), shape)


def kept(h: np.ndarray, p: float) -> np.ndarray:
    """Which elements of hash `h` are kept: u = (h >> 8) 2^-24 >= p."""
    return (h >> np.uint32(8)).astype(np.float64) * 2.0**-24 >= p


def scaled(x: np.ndarray, keep: np.ndarray, p: float) -> np.ndarray:
    """Kept elements of x scaled by 1 / (1 - p) (rounded to x's dtype first), others 0."""
    return np.where(keep, x / x.dtype.type(1.0 - p), x.dtype.type(0))


def dropout_keep(shape, p: float, seed: int, key: int, step: int) -> np.ndarray:
    """The keep mask (bool) of `ember.dropout` for one step."""
    return kept(dropout_hash(shape, seed, key, step), p)


def dropout(x: np.ndarray, p: float, seed: int, key: int, step: int) -> np.ndarray:
    """The reference `ember.dropout`: kept elements scaled by 1 / (1 - p), the rest zero."""
    x = np.asarray(x)
    if p == 0:
        return x.copy()
    return scaled(x, dropout_keep(x.shape, p, seed, key, step), p)
