"""torch's tensor constructors with its signatures (`zeros(2, 3)`, `arange(5)`) and default
dtypes (float32; int64 for integer ranges), giving numpy arrays: inside `forward` an array
is a constant of the graph, and as a Param's value (`nn.Parameter(em.zeros(1, 1, d))`) its
initial value, so code that builds tensors the way PyTorch code does ports unchanged."""

from __future__ import annotations

import numpy as np

from ..ir import DTYPES, numpy_dtype


def _shape(size) -> tuple[int, ...]:
    return tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)


def _dtype(dtype, default: str = "f32") -> np.dtype:
    """An ember dtype name ("f32"), a numpy dtype, or None for `default`."""
    if dtype is None or isinstance(dtype, str) and dtype in DTYPES:
        return np.dtype(numpy_dtype(dtype or default))
    return np.dtype(dtype)


def zeros(*size, dtype=None) -> np.ndarray:
    return np.zeros(_shape(size), _dtype(dtype))


def ones(*size, dtype=None) -> np.ndarray:
    return np.ones(_shape(size), _dtype(dtype))


def full(size, fill_value, dtype=None) -> np.ndarray:
    return np.full(_shape((size,)), fill_value, _dtype(dtype))


def arange(start, end=None, step=1, dtype=None) -> np.ndarray:
    """int64 when start, end and step are all ints (as torch), else float32."""
    whole = all(isinstance(v, (int, np.integer)) for v in (start, end, step) if v is not None)
    values = np.arange(start, step=step) if end is None else np.arange(start, end, step)
    return values.astype(_dtype(dtype, "i64" if whole else "f32"))
