"""Host buffers for compiled graphs: 64-byte aligned storage, the layout of scratch
memory, guard pages and input conversion.

numpy only guarantees 16-byte alignment; a cache-line aligned buffer keeps vector loads
from splitting lines. Generated code declares no alignment beyond the element's, so
caller arrays (inputs, params) are used in place whenever they are contiguous.

Guard pages (for tests): inside `with guarded():` every buffer allocated here (an
executable's temps, each its own buffer then rather than a slice of the arena, constants,
scalar inputs, scratch and returned results) ends exactly where an inaccessible
(PROT_NONE) page begins, so a kernel that reads or writes even one byte past a buffer's
end segfaults instead of silently using a neighbour's memory. Such a
buffer starts wherever its size puts it: element aligned (a page is a multiple of every
element size), which is all generated code assumes. `guarded_copy(a)` makes an input that
ends at a guard page (inputs are used in place, so kernels reading past them fault too).
The mode is read when a buffer is allocated: build and call the executable inside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import mmap
import os
from collections.abc import Iterator

import numpy as np

from ....ir import TensorType, numpy_dtype

ALIGN = 64
_guards = 0  # how many `guarded()` blocks are open


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Allocate every buffer so that it ends at a guard page (see the module docstring)."""
    global _guards
    _guards += 1
    try:
        yield
    finally:
        _guards -= 1


def guarding() -> bool:
    """Whether buffers allocated now end at guard pages (inside `guarded()`)."""
    return _guards > 0


def regions(*nbytes: int) -> tuple[list[int], int]:
    """Byte offsets of consecutive regions of `nbytes` bytes in one scratch buffer, each
    starting on an ALIGN boundary, and the bytes they span: the one layout that both a
    kernel's scratch size and its code read, so the two cannot disagree."""
    offsets, end = [], 0
    for n in nbytes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, end


def raw_bytes(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """`nbytes` uninitialized bytes starting on an `align`-byte boundary, or ending at a
    guard page inside `guarded()`."""
    if _guards:
        return _guarded_bytes(nbytes)
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes]


def _guarded_bytes(nbytes: int) -> np.ndarray:
    """Bytes that end where a PROT_NONE page begins. The array's base is an array over the
    whole mapping, which keeps the mapping alive (and unmapped once nothing refers to it)."""
    page = mmap.PAGESIZE
    size = -(-nbytes // page) * page + page
    whole = np.frombuffer(mmap.mmap(-1, size), np.uint8)
    guard = whole.ctypes.data + size - page
    if _libc().mprotect(ctypes.c_void_p(guard), ctypes.c_size_t(page), 0) != 0:  # PROT_NONE
        err = ctypes.get_errno()
        raise OSError(err, f"mprotect of a guard page failed: {os.strerror(err)}")
    return whole[size - page - nbytes:size - page]


@functools.cache
def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lib


def data_address(x: np.ndarray) -> int:
    """The data pointer of a contiguous array (ctypes' from_buffer is the fast way; it
    needs a writable, non-empty buffer)."""
    try:
        return _addressof(_from_buffer(x))
    except (TypeError, ValueError, BufferError):
        return x.ctypes.data


_addressof, _from_buffer = ctypes.addressof, ctypes.c_char.from_buffer


def aligned_empty(t: TensorType, align: int = ALIGN) -> tuple[np.ndarray, int]:
    """An uninitialized array of type `t` starting on an `align`-byte boundary (ending at
    a guard page inside `guarded()`), and its address."""
    dt = numpy_dtype(t.dtype)
    raw = raw_bytes(math.prod(t.shape) * dt.itemsize, align)
    return raw.view(dt).reshape(t.shape), raw.ctypes.data


def guarded_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `a` that ends at a guard page: an input that makes a kernel
    reading past its end fault."""
    a = np.asarray(a)
    out = _guarded_bytes(a.nbytes).view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


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
