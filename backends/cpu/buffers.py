"""Host buffers for compiled graphs: 64-byte aligned storage and input conversion.

numpy only guarantees 16-byte alignment; a cache-line aligned buffer keeps vector loads
from splitting lines. Generated code declares no alignment beyond the element's, so
caller arrays (inputs, params) are used in place whenever they are contiguous.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import TensorType, numpy_dtype

ALIGN = 64


def aligned_empty(t: TensorType, align: int = ALIGN) -> tuple[np.ndarray, int]:
    """An uninitialized array of type `t` starting on an `align`-byte boundary, and its
    address."""
    dt = numpy_dtype(t.dtype)
    nbytes = math.prod(t.shape) * dt.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    addr = raw.ctypes.data
    start = -addr % align
    return raw[start:start + nbytes].view(dt).reshape(t.shape), addr + start


def aligned_copy(a: np.ndarray, t: TensorType) -> np.ndarray:
    out, _ = aligned_empty(t)
    out[...] = np.asarray(a, dtype=out.dtype).reshape(t.shape)
    return out


def as_input(x, t: TensorType, dtype: np.dtype, what: str) -> np.ndarray:
    """`x` as a C-contiguous, aligned array of `dtype` (a copy only when needed).

    Converts what converts without losing meaning (a Python scalar or list, a strided
    view, float64 to float32, int32 labels to int64); rejects, naming `what`, anything
    else (floats for integer inputs, strings, objects) and every shape mismatch: the
    generated code trusts shapes completely, so this check is what keeps it in bounds.
    """
    if type(x) is np.ndarray and x.dtype == dtype and x.flags.c_contiguous \
            and x.flags.aligned and x.shape == t.shape:
        return x
    try:
        a = np.asarray(x)
    except Exception as e:  # noqa: BLE001  (anything numpy cannot read)
        raise TypeError(f"{what}: expected an array of {t}, got {type(x).__name__} ({e})") \
            from None
    if a.dtype != dtype and not _converts(a.dtype, dtype):
        raise TypeError(f"{what}: expected {dtype} values for {t}, got an array of {a.dtype}"
                        " (convert it explicitly if that is meant)")
    if a.shape != t.shape:
        raise ValueError(f"{what}: expected shape {list(t.shape)} ({t}), got {list(a.shape)}")
    return np.require(a, dtype, ["C", "A"])


def _converts(src: np.dtype, dst: np.dtype) -> bool:
    """Whether values of `src` become `dst` without changing kind: numbers to floats,
    integers to integers, bools to bools."""
    if dst.kind == "f":
        return src.kind in "fiub"
    if dst.kind in "iu":
        return src.kind in "iub"
    if dst.kind == "b":
        return src.kind == "b"
    return False
