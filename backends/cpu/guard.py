"""What a bound call (feedback.py) checks of the arrays it reads and writes, and how it
binds its tensor inputs, run natively at the top of the entry: in Python each check costs
~100 ns an array (the small MLP's step reads 4 and writes 8 objects) and binding another
input array ~1.3 us, natively a few loads.

A guard is an int64 table: its record count and numpy.ndarray's address, then one record
per object, `(address, refcount ceiling, dtype address or 0, ndim, slot, dims...)`. The
entry (`emit_guard`) refuses the call, before any kernel runs, where an object's refcount
is above its ceiling (someone else holds an array the call would write) or, for a record
with a dtype, the array's dtype, ndim or shape is not the record's (numpy lets a caller
set an array's shape or dtype in place). A record with a slot is an input, whose address
the caller writes before each call (`Guard.bind`): it must also be a numpy.ndarray (not a
subclass), C-contiguous and aligned, and its data pointer goes into that slot of the
buffer table. The guard reads the objects' headers as CPython's and NumPy's C APIs do
(`Py_REFCNT`, `Py_TYPE`, `PyArray_DATA`, `PyArray_NDIM`, `PyArray_DIMS`, `PyArray_DESCR`,
`PyArray_FLAGS`: fields at fixed offsets since NumPy 1.7); `native()` checks once that
this interpreter lays them out so (a free-threaded build does not), and where it does not,
callers bind and check in Python.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import sysconfig
from collections.abc import Iterable, Sequence

import numpy as np
from llvmlite import ir

from .loops import for_range
from .scalar import I32, I64, PTR, i64

# byte offsets in a PyObject (its refcount's low 32 bits: all of it for any count below
# 2**32; its type) and in a PyArrayObject
REFCNT, TYPE, DATA, NDIM, DIMS, DESCR, FLAGS = 0, 8, 16, 24, 32, 56, 64
BINDABLE = 0x1 | 0x100  # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED
MAX_DIMS = 8  # an array with more keeps the Python checks
RECORD = 5 + MAX_DIMS  # address, ceiling, dtype, ndim, slot, dims
HEAD = 2  # the record count, numpy.ndarray's address
UNCHECKED = 1 << 62  # the ceiling of a record that checks no refcount


def _read(x, offset: int, ctype):
    return ctype.from_address(id(x) + offset).value


@functools.cache
def native() -> bool:
    """Whether the guard reads this interpreter's objects right: tried on an array whose
    refcount, type, data, dtype, shape and flags are known."""
    if sysconfig.get_config_var("Py_GIL_DISABLED") or sys.maxsize != 2 ** 63 - 1 \
            or sys.byteorder != "little":
        return False
    a = np.empty((3, 5), np.float32)
    count = ctypes.c_uint32.from_address(id(a) + REFCNT)  # read with no call holding `a`
    before = count.value
    extra = a  # noqa: F841  (one more reference, which the count must see)
    dims = ctypes.cast(_read(a, DIMS, ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64))
    # getrefcount counts its argument too: the ceilings callers derive from it are one up
    return (count.value == before + 1 == sys.getrefcount(a) - 1
            and _read(a, TYPE, ctypes.c_void_p) == id(np.ndarray)
            and _read(a, DATA, ctypes.c_void_p) == a.ctypes.data
            and _read(a, DESCR, ctypes.c_void_p) == id(a.dtype)
            and _read(a, NDIM, ctypes.c_int32) == 2 and (dims[0], dims[1]) == (3, 5)
            and _read(a, FLAGS, ctypes.c_int32) & BINDABLE == BINDABLE
            and _read(a[:, ::2], FLAGS, ctypes.c_int32) & BINDABLE == 0x100)


def covers(shapes: Iterable[tuple]) -> bool:
    """Whether guards can check and bind arrays of these shapes here (else callers do it
    in Python)."""
    return native() and all(len(shape) <= MAX_DIMS for shape in shapes)


class Guard:
    """The guard of a call that binds `inputs` (the buffer slot, dtype and shape of each:
    the caller puts each call's objects in with `bind`, and the entry binds their data
    where each is a C-contiguous, aligned numpy.ndarray of that dtype and shape), writes
    `held` (objects with the refcount each may have while the call runs) and reads
    `laid_out` (arrays that must keep the shape and dtype they have now). The caller keeps
    every object alive while the guard is in use (an address is compared, never followed
    after its object went); the guard keeps the dtypes it compares."""

    def __init__(self, inputs: Sequence[tuple[int, np.dtype, tuple]],
                 held: Sequence[tuple[object, int]], laid_out: Sequence[np.ndarray]):
        if not covers([*(shape for *_, shape in inputs), *(a.shape for a in laid_out)]):
            raise ValueError(f"no guard here: this interpreter's objects are not read "
                             f"natively, or an array has over {MAX_DIMS} dimensions")
        self.dtypes = [*(d for _, d, _ in inputs), *(a.dtype for a in laid_out)]
        rows = [[0, UNCHECKED, id(d), len(shape), slot, *shape] for slot, d, shape in inputs]
        rows += [[id(x), ceiling, 0, 0, -1] for x, ceiling in held]
        rows += [[id(a), UNCHECKED, id(a.dtype), a.ndim, -1, *a.shape] for a in laid_out]
        self.table = np.zeros(HEAD + RECORD * len(rows), np.int64)
        self.table[:HEAD] = len(rows), id(np.ndarray)
        for k, row in enumerate(rows):
            self.table[HEAD + RECORD * k:HEAD + RECORD * k + len(row)] = row
        self.address = self.table.ctypes.data
        self._cells = (ctypes.c_int64 * len(self.table)).from_buffer(self.table)
        self._objects = range(HEAD, HEAD + RECORD * len(inputs), RECORD)

    def bind(self, objects: Sequence) -> None:
        """This call's inputs, in the order of `inputs` (alive until the call returns; one
        missing would leave the last call's address, which the entry would follow)."""
        cells = self._cells
        for k, x in zip(self._objects, objects, strict=True):
            cells[k] = id(x)


def emit_guard(mod: ir.Module) -> ir.Function:
    """`ember_guard(ptr table, ptr buffers) -> i64`: nonzero where some record fails; each
    input's data pointer stored in its slot of `buffers`."""
    fn = ir.Function(mod, ir.FunctionType(I64, [PTR, PTR]), "ember_guard")
    fn.linkage = "internal"
    table, buffers = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    bad = b.alloca(I64, name="bad")
    b.store(i64(0), bad)

    def field(row: ir.Value, k: int | ir.Value) -> ir.Value:
        k = i64(k) if isinstance(k, int) else k
        return b.load(b.gep(row, [k], inbounds=True, source_etype=I64), typ=I64)

    def at(obj: ir.Value, offset: int, typ: ir.Type) -> ir.Value:
        return b.load(b.gep(obj, [i64(offset)], inbounds=True, source_etype=ir.IntType(8)),
                      typ=typ)

    def flag(value: ir.Value) -> None:
        b.store(b.or_(b.load(bad, typ=I64), b.zext(value, I64)), bad)

    def branch(cond: ir.Value, name: str) -> ir.Block:
        """Continue at a new block where `cond` holds; the block after it returned."""
        then, after = b.append_basic_block(name), b.append_basic_block(f"{name}.after")
        b.cbranch(cond, then, after)
        b.position_at_end(then)
        return after

    def record(k: ir.Value) -> None:
        row = b.gep(table, [b.add(i64(HEAD), b.mul(k, i64(RECORD)))], inbounds=True,
                    source_etype=I64)
        obj = b.inttoptr(field(row, 0), PTR)
        flag(b.icmp_unsigned(">", b.zext(at(obj, REFCNT, I32), I64), field(row, 1)))
        slot, dtype = field(row, 4), field(row, 2)
        is_input = b.icmp_signed(">=", slot, i64(0))
        # an input's fields are read only once it is known to be an array
        array = b.icmp_unsigned("==", b.ptrtoint(at(obj, TYPE, PTR), I64), field(table, 1))
        flag(b.and_(is_input, b.not_(array)))
        after = branch(b.and_(b.icmp_unsigned("!=", dtype, i64(0)),
                              b.or_(b.not_(is_input), array)), "layout")
        ndim = field(row, 3)
        moved = b.or_(b.icmp_unsigned("!=", b.ptrtoint(at(obj, DESCR, PTR), I64), dtype),
                      b.icmp_unsigned("!=", b.sext(at(obj, NDIM, I32), I64), ndim))
        flag(moved)
        dims = at(obj, DIMS, PTR)

        def dim(j: ir.Value) -> None:
            got = b.load(b.gep(dims, [j], inbounds=True, source_etype=I64), typ=I64)
            flag(b.icmp_unsigned("!=", got, field(row, b.add(j, i64(5)))))

        for_range(b, i64(0), b.select(moved, i64(0), ndim), dim, "j")
        bind = branch(is_input, "bind")
        flags = b.and_(at(obj, FLAGS, I32), ir.Constant(I32, BINDABLE))
        flag(b.icmp_unsigned("!=", flags, ir.Constant(I32, BINDABLE)))
        b.store(at(obj, DATA, PTR), b.gep(buffers, [slot], inbounds=True, source_etype=PTR))
        b.branch(bind)
        b.position_at_end(bind)
        b.branch(after)
        b.position_at_end(after)

    for_range(b, i64(0), b.load(table, typ=I64), record, "k")
    b.ret(b.load(bad, typ=I64))
    return fn


__all__ = ["MAX_DIMS", "Guard", "covers", "emit_guard", "native"]
