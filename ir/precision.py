"""What an op on bf16 or f16 values means: computed in f32, its result rounded once.

That is PyTorch's rule on the CPU for most ops (reductions and matmuls accumulate in f32
too), the rule of every numpy reference here (the interpreter, constant folding), and
what lets a backend with f32 kernels only run such an op between casts
(passes/widen.py) and get the same bits.
"""

from __future__ import annotations

import numpy as np

from .types import LOW_PRECISION, numpy_dtype

_LOW = frozenset(numpy_dtype(d) for d in LOW_PRECISION)


def widened(x: np.ndarray) -> np.ndarray:
    """`x` as f32 where it holds bf16 or f16 (exactly: f32 holds every such value)."""
    return x.astype(np.float32) if x.dtype in _LOW else x


def rounded(value: object, dtype: str) -> np.ndarray:
    """An op's computed `value` as its result's `dtype`: bf16 and f16 are rounded from the
    value's f32 (a value computed in f64 or an integer is rounded to f32 first), as a
    kernel computing in f32 then casting rounds, and as PyTorch converts."""
    if dtype in LOW_PRECISION:
        value = np.asarray(value, np.float32)
    return np.asarray(value, numpy_dtype(dtype))
