"""`ember.allreduce` on the cpu: the kernel copies its operand into its result, then calls
`ember_allreduce(ptr, count, dtype)`, a native entry point that hands the buffer (as a
numpy view, no copy) to backends/collectives.py, which sums it across ranks in place.

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
_DTYPES = ("f32", "f64")  # the code passed to the callback is the index here
_C_TYPES = {"f32": ctypes.c_float, "f64": ctypes.c_double}


def _reduce(address: int, count: int, code: int) -> None:
    try:
        c_type = _C_TYPES[_DTYPES[code]]
        buf = (c_type * count).from_address(address)
        collectives.allreduce_(np.ctypeslib.as_array(buf))
    except BaseException as e:  # noqa: BLE001  (raised after the native call returns)
        collectives.record(e)


_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32)(_reduce)


@functools.cache
def load_symbols() -> None:
    llvm.add_symbol(SYMBOL, ctypes.cast(_CALLBACK, ctypes.c_void_p).value)


def allreduce(b: ir.IRBuilder, out, ins, op) -> None:
    t = op.result.type
    (x,) = ins
    loop(b, t.size, lambda i: S.store(b, out, t.dtype, i, S.load(b, x, t.dtype, i)), "i")
    fn = S.declare(b.module, SYMBOL, ir.VoidType(), [PTR, I64, I32])
    b.call(fn, [out, ir.Constant(I64, t.size), ir.Constant(I32, _DTYPES.index(t.dtype))])
