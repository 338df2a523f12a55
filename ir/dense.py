"""Dense element attributes (an `ember.constant`'s value): splat detection and a hashable
key. Neither materializes a splat: the parser keeps a big one as a read-only broadcast view
(stride 0 everywhere), so `dense<1.0> : tensor<100000x100000xf32>` costs bytes, not 40 GB,
in every pass that does not need its elements.
"""

from __future__ import annotations

import numpy as np


def splat_element(a: np.ndarray) -> np.generic | None:
    """The element of an array whose elements all have the same bits, else None (also for
    an empty array); a broadcast view answers without reading its elements."""
    if a.size == 0:
        return None
    first: np.generic = a.flat[0]
    if a.size == 1 or not any(a.strides):
        return first
    raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(a.size, -1)
    return first if bool((raw == raw[0]).all()) else None


def dense_key(a: np.ndarray) -> tuple[str, str, tuple[int, ...], bool, bytes]:
    """A hashable key equal for arrays of the same dtype, shape and element bits; a splat is
    keyed by its one element."""
    first = splat_element(a)
    data = a.tobytes() if first is None else first.tobytes()
    return ("dense", a.dtype.str, a.shape, first is not None, data)
