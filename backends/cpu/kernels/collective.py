"""`ember.allreduce` on the cpu: the kernel copies its operand into its result, then calls
`ember_allreduce(ptr, count, dtype)`, a native entry point that hands the buffer (as a
numpy view, no copy) to backends/collectives.py, which sums it across ranks in place.
`ember.grads_ready` calls `ember_grads_ready(bucket)` the same way.

The entry point is a ctypes callback made resolvable to generated code with
`llvm.add_symbol` when the backend starts (so cached object code links too). A ctypes
callback cannot raise: an error is recorded and raised by the executable once the native
call returns.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir

from ... import collectives
from . import scalar as S
from .loops import loop
from .scalar import I32, I64, PTR

SYMBOL = "ember_allreduce"
READY_SYMBOL = "ember_grads_ready"
_DTYPES = ("f32", "f64")  # the code passed to the callback is the index here
_C_TYPES = {"f32": ctypes.c_float, "f64": ctypes.c_double}


def _reduce(address: int, count: int, code: int) -> None:
    try:
        c_type = _C_TYPES[_DTYPES[code]]
        buf = (c_type * count).from_address(address)
        collectives.allreduce_(np.ctypeslib.as_array(buf))
    except BaseException as e:  # noqa: BLE001  (raised after the native call returns)
        collectives.record(e)


def _ready(bucket: int) -> None:
    try:
        collectives.grads_ready(bucket)
    except BaseException as e:  # noqa: BLE001  (raised after the native call returns)
        collectives.record(e)


_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32)(_reduce)
_READY = ctypes.CFUNCTYPE(None, ctypes.c_int64)(_ready)


@functools.cache
def load_symbols() -> None:
    llvm.add_symbol(SYMBOL, ctypes.cast(_CALLBACK, ctypes.c_void_p).value)
    llvm.add_symbol(READY_SYMBOL, ctypes.cast(_READY, ctypes.c_void_p).value)


def allreduce(b: ir.IRBuilder, out, ins, op) -> None:
    t = op.result.type
    (x,) = ins
    loop(b, t.size, lambda i: S.store(b, out, t.dtype, i, S.load(b, x, t.dtype, i)), "i")
    fn = S.declare(b.module, SYMBOL, ir.VoidType(), [PTR, I64, I32])
    b.call(fn, [out, ir.Constant(I64, t.size), ir.Constant(I32, _DTYPES.index(t.dtype))])


def grads_ready(b: ir.IRBuilder, out, ins, op) -> None:
    """`ember.grads_ready`: store the bucket's index (the token), then call
    `ember_grads_ready(bucket)`."""
    bucket = ir.Constant(I64, op.attributes["bucket"])
    S.store(b, out, "i64", ir.Constant(I32, 0), bucket)
    b.call(S.declare(b.module, READY_SYMBOL, ir.VoidType(), [I64]), [bucket])
