"""What a bound call (feedback.py) checks of the arrays it reads and writes, run natively
at the top of the entry: in Python each check costs ~100 ns an array (the small MLP's step
reads 4 and writes 8 objects), natively a few loads.

A guard is an int64 table: its record count, then one record per object, `(address,
refcount ceiling, dtype address or 0, ndim, dims...)`. The entry (`emit_guard`) refuses the
call, before any kernel runs, where an object's refcount is above its ceiling (someone else
holds an array the call would write) or, for a record with a dtype, the array's dtype,
ndim or shape is not the record's (numpy lets a caller set an array's shape or dtype in
place). It reads the objects' headers as CPython's and NumPy's C APIs do (`Py_REFCNT`,
`PyArray_DESCR`, `PyArray_NDIM`, `PyArray_DIMS`: fields at fixed offsets since NumPy 1.7);
`native()` checks once that this interpreter lays them out so (a free-threaded build does
not), and where it does not, callers check in Python.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import sysconfig
from collections.abc import Sequence

import numpy as np
from llvmlite import ir

from .loops import for_range
from .scalar import I32, I64, PTR, i64

# byte offsets in a PyObject (its refcount's low 32 bits: all of it for any count below
# 2**32) and in a PyArrayObject
REFCNT, NDIM, DIMS, DESCR = 0, 24, 32, 56
MAX_DIMS = 8  # an array with more keeps the Python checks
RECORD = 4 + MAX_DIMS
UNCHECKED = 1 << 62  # the ceiling of a record that checks only a layout


@functools.cache
def native() -> bool:
    """Whether the guard reads this interpreter's objects right: tried on an array whose
    refcount, dtype and shape are known."""
    if sysconfig.get_config_var("Py_GIL_DISABLED") or sys.maxsize != 2 ** 63 - 1 \
            or sys.byteorder != "little":
        return False
    a = np.empty((3, 5), np.float32)
    count = ctypes.c_uint32.from_address(id(a) + REFCNT)
    before = count.value
    extra = a  # noqa: F841  (one more reference, which the count must see)
    dims = ctypes.cast(ctypes.c_void_p.from_address(id(a) + DIMS).value,
                       ctypes.POINTER(ctypes.c_int64))
    # getrefcount counts its argument too: the ceilings callers derive from it are one up
    return (count.value == before + 1 == sys.getrefcount(a) - 1
            and ctypes.c_void_p.from_address(id(a) + DESCR).value == id(a.dtype)
            and ctypes.c_int32.from_address(id(a) + NDIM).value == 2
            and (dims[0], dims[1]) == (3, 5))


class Guard:
    """The guard of a call that writes `held` (objects with the refcount each may have
    while the call runs) and reads `laid_out` (arrays that must keep the shape and dtype
    they have now). The caller keeps every object alive while the guard is in use (an
    address is compared, never followed after its object went); the guard keeps the
    dtypes it compares."""

    def __init__(self, held: Sequence[tuple[object, int]], laid_out: Sequence[np.ndarray]):
        if any(a.ndim > MAX_DIMS for a in laid_out):
            raise ValueError(f"a guard checks arrays of up to {MAX_DIMS} dimensions")
        self.dtypes = [a.dtype for a in laid_out]
        rows = [[id(x), ceiling, 0, 0] for x, ceiling in held]
        rows += [[id(a), UNCHECKED, id(d), a.ndim, *a.shape] for a, d in zip(laid_out,
                                                                             self.dtypes)]
        self.table = np.zeros(1 + RECORD * len(rows), np.int64)
        self.table[0] = len(rows)
        for k, row in enumerate(rows):
            self.table[1 + RECORD * k:1 + RECORD * k + len(row)] = row
        self.address = self.table.ctypes.data


def emit_guard(mod: ir.Module) -> ir.Function:
    """`ember_guard(ptr table) -> i64`: nonzero where some record fails."""
    fn = ir.Function(mod, ir.FunctionType(I64, [PTR]), "ember_guard")
    fn.linkage = "internal"
    table = fn.args[0]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    bad = b.alloca(I64, name="bad")
    b.store(i64(0), bad)

    def field(row: ir.Value, k: int) -> ir.Value:
        return b.load(b.gep(row, [i64(k)], inbounds=True, source_etype=I64), typ=I64)

    def at(obj: ir.Value, offset: int) -> ir.Value:
        return b.gep(obj, [i64(offset)], inbounds=True, source_etype=ir.IntType(8))

    def flag(value: ir.Value) -> None:
        b.store(b.or_(b.load(bad, typ=I64), b.zext(value, I64)), bad)

    def record(k: ir.Value) -> None:
        row = b.gep(table, [b.add(i64(1), b.mul(k, i64(RECORD)))], inbounds=True,
                    source_etype=I64)
        obj = b.inttoptr(field(row, 0), PTR)
        refs = b.zext(b.load(at(obj, REFCNT), typ=I32), I64)
        flag(b.icmp_unsigned(">", refs, field(row, 1)))
        dtype = field(row, 2)
        layout, done = b.append_basic_block("layout"), b.append_basic_block("done")
        b.cbranch(b.icmp_unsigned("!=", dtype, i64(0)), layout, done)
        b.position_at_end(layout)
        ndim = field(row, 3)
        moved = b.or_(b.icmp_unsigned("!=", b.ptrtoint(b.load(at(obj, DESCR), typ=PTR), I64),
                                      dtype),
                      b.icmp_unsigned("!=", b.sext(b.load(at(obj, NDIM), typ=I32), I64), ndim))
        flag(moved)
        dims = b.load(at(obj, DIMS), typ=PTR)

        def dim(j: ir.Value) -> None:
            got = b.load(b.gep(dims, [j], inbounds=True, source_etype=I64), typ=I64)
            want = b.load(b.gep(row, [b.add(j, i64(4))], inbounds=True, source_etype=I64),
                          typ=I64)
            flag(b.icmp_unsigned("!=", got, want))

        for_range(b, i64(0), b.select(moved, i64(0), ndim), dim, "j")
        b.branch(done)
        b.position_at_end(done)

    for_range(b, i64(0), b.load(table, typ=I64), record, "k")
    b.ret(b.load(bad, typ=I64))
    return fn


__all__ = ["MAX_DIMS", "Guard", "emit_guard", "native"]
