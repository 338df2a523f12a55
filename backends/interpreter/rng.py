"""The counter-based generator behind `ember.dropout`: the definition every backend matches.

    mix(x): x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
    h = mix(seed32 ^ mix(key32 ^ mix(step32 ^ mix(index32))))       (uint32, wrapping)
    u = (h >> 8) * 2**-24;  keep = u >= p;  y = keep ? x / (1 - p) : 0

seed32, key32, step32 are the low 32 bits of the op's `seed`, `key` and the `rng` operand
(the step counter); index32 is the low 32 bits of shard * numel + the element's row-major
flat index, where shard is the `rng` operand's high 32 bits (rng >> 32) and numel the
result's size. A data-parallel rank passes its rank as the shard, so its slice of the
global batch draws the mask one process would draw for those rows. `1 - p` is computed
in float64 and rounded to x's dtype before the division. Equivalently, in integers:
keep = (h >> 8) >= ceil(p * 2**24).
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


def dropout_hash(shape, seed: int, key: int, step: int) -> np.ndarray:
    """h (uint32) for every element of a tensor of `shape`."""
    n = int(np.prod(shape, dtype=np.int64))
    index = (np.arange(n, dtype=np.uint64) + np.uint64((int(step) >> 32) * n)).astype(np.uint32)
    s, k, t = (np.uint32(int(v) & _MASK) for v in (seed, key, step))
    return mix32(s ^ mix32(k ^ mix32(t ^ mix32(index)))).reshape(shape)


def dropout_keep(shape, p: float, seed: int, key: int, step: int) -> np.ndarray:
    """The keep mask (bool) of `ember.dropout` for one step."""
    u = (dropout_hash(shape, seed, key, step) >> np.uint32(8)).astype(np.float64) * 2.0**-24
    return u >= p


def dropout(x: np.ndarray, p: float, seed: int, key: int, step: int) -> np.ndarray:
    """The reference `ember.dropout`: kept elements scaled by 1 / (1 - p), the rest zero."""
    x = np.asarray(x)
    if p == 0:
        return x.copy()
    keep = dropout_keep(x.shape, p, seed, key, step)
    return np.where(keep, x / x.dtype.type(1.0 - p), x.dtype.type(0))
