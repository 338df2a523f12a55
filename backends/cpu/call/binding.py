"""What a bound call (bound.py) checks of the arrays it reads and writes, and how it
binds its inputs, run natively at the top of the entry: in Python each check costs ~100 ns
an array (the small MLP's step reads 4 and writes 8 objects), binding another input array
~1.3 us and each scalar ~100 ns; natively, a few loads each.

A guard is an int64 table: a head (`HEAD`: the sections' sizes, the addresses of the
types it compares, and this call's list of inputs), then three sections of records. An
input record `(position, slot, dtype, ndim, dims...)` binds the array at that position of
the inputs: it must be exactly a numpy.ndarray of that dtype (by identity) and shape,
C-contiguous and aligned, and its data pointer goes into that slot of the buffer table. A
scalar record `(position, buffer, double)` copies the number at that position (exactly a
Python float, numpy.float64 or numpy.float32) into the scalar's buffer, as a double or
rounded to a float (another type, an int included, is the general path's to convert). An
object record `(address, refcount ceiling, dtype or 0, ndim, dims...)` refuses the call
where someone else holds an array the call would write (its refcount above the ceiling)
or, with a dtype, where the array's dtype, ndim, shape or contiguity is no longer the
record's (numpy lets a caller set shape, dtype and strides in place). Any failure refuses
the call before a kernel runs, and the caller takes its general path, which converts or
explains.

The guard reads the objects' headers as CPython's and NumPy's C APIs do (`Py_REFCNT`,
`Py_TYPE`, `PyFloat_AS_DOUBLE`, `PyArrayScalar_VAL`, `PyList_GET_SIZE`, `PyList_GET_ITEM`,
`PyArray_DATA`, `PyArray_NDIM`, `PyArray_DIMS`, `PyArray_DESCR`, `PyArray_FLAGS`: fields
at fixed offsets since NumPy 1.7); `native()` checks once that this interpreter lays them
out so (a free-threaded build does not), and where it does not, callers bind and check in
Python.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import sysconfig
from collections.abc import Iterable, Sequence

import numpy as np
from llvmlite import ir

from ..kernels.loops import for_range
from ..kernels.scalar import I32, I64, PTR, REG, i64

# byte offsets in a PyObject (its refcount's low 32 bits: all of it for any count below
# 2**32; its type), a float, a list and a PyArrayObject
REFCNT, TYPE, FLOAT, SIZE, ITEMS = 0, 8, 16, 16, 24
DATA, NDIM, DIMS, DESCR, FLAGS = 16, 24, 32, 56, 64
BINDABLE = 0x1 | 0x100  # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED
MAX_DIMS = 8  # an array with more keeps the Python checks
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # the scalar dtypes a guard copies
# the head: the record counts of the inputs, scalars and objects; the types list,
# numpy.ndarray, float, numpy.float64 and numpy.float32; this call's inputs (a list)
HEAD = 9
LIST_T, ARRAY_T, FLOAT_T, FLOAT64_T, FLOAT32_T, ARGS = 3, 4, 5, 6, 7, 8  # in the head
INPUT, SCALAR, OBJECT = 4 + MAX_DIMS, 3, 4 + MAX_DIMS  # record sizes
LAYOUT = 2  # where an input or object record's dtype, ndim and dims start
UNCHECKED = 1 << 62  # the ceiling of a record that checks no refcount


def _read(x, offset: int, ctype):
    return ctype.from_address(id(x) + offset).value


@functools.cache
def native() -> bool:
    """Whether the guard reads this interpreter's objects right: tried on an array whose
    refcount, type, data, dtype, shape and flags are known, floats and a list."""
    if sysconfig.get_config_var("Py_GIL_DISABLED") or sys.maxsize != 2 ** 63 - 1 \
            or sys.byteorder != "little":
        return False
    a = np.empty((3, 5), np.float32)
    count = ctypes.c_uint32.from_address(id(a) + REFCNT)  # read with no call holding `a`
    before = count.value
    extra = a  # noqa: F841  (one more reference, which the count must see)
    dims = ctypes.cast(_read(a, DIMS, ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64))
    f, items = 0.1, [None, 2.5]
    second = ctypes.c_void_p.from_address(_read(items, ITEMS, ctypes.c_void_p) + 8).value
    # getrefcount counts its argument too: the ceilings callers derive from it are one up
    return (count.value == before + 1 == sys.getrefcount(a) - 1
            and _read(a, TYPE, ctypes.c_void_p) == id(np.ndarray)
            and _read(a, DATA, ctypes.c_void_p) == a.ctypes.data
            and _read(a, DESCR, ctypes.c_void_p) == id(a.dtype)
            and _read(a, NDIM, ctypes.c_int32) == 2 and (dims[0], dims[1]) == (3, 5)
            and _read(a, FLAGS, ctypes.c_int32) & BINDABLE == BINDABLE
            and _read(a[:, ::2], FLAGS, ctypes.c_int32) & BINDABLE == 0x100
            and _read(f, TYPE, ctypes.c_void_p) == id(float)
            and _read(f, FLOAT, ctypes.c_double) == f
            and _read(np.float64(f), FLOAT, ctypes.c_double) == f
            and _read(np.float32(f), FLOAT, ctypes.c_float) == np.float32(f)
            and _read(items, TYPE, ctypes.c_void_p) == id(list)
            and _read(items, SIZE, ctypes.c_int64) == 2 and second == id(items[1]))


def covers(shapes: Iterable[tuple]) -> bool:
    """Whether guards can check and bind arrays of these shapes here (else callers do it
    in Python)."""
    return native() and all(len(shape) <= MAX_DIMS for shape in shapes)


class Guard:
    """The guard of a call that binds `inputs` (each array's position among the call's
    inputs, its buffer slot, dtype and shape) and `scalars` (each float's position, its
    scalar buffer's address and dtype: float32 or float64), takes the call's inputs as a
    list (`bind`), writes `held` (objects with the refcount each may have while the call
    runs) and reads `laid_out` (arrays that must keep the shape and dtype they have now).
    The caller keeps every object alive while the guard is in use (an address is
    compared, never followed after its object went); the guard keeps the dtypes it
    compares."""

    def __init__(self, inputs: Sequence[tuple[int, int, np.dtype, tuple]],
                 scalars: Sequence[tuple[int, int, np.dtype]],
                 held: Sequence[tuple[object, int]], laid_out: Sequence[np.ndarray]):
        if not covers([*(shape for *_, shape in inputs), *(a.shape for a in laid_out)]) \
                or any(d not in FLOATS for *_, d in scalars):
            raise ValueError(f"no guard here: this interpreter's objects are not read "
                             f"natively, an array has over {MAX_DIMS} dimensions or a "
                             f"scalar is not a float")
        self.dtypes = [*(d for *_, d, _ in inputs), *(a.dtype for a in laid_out)]
        objects = [[id(x), ceiling, 0, 0] for x, ceiling in held]
        objects += [[id(a), UNCHECKED, id(a.dtype), a.ndim, *a.shape] for a in laid_out]
        sections = (
            (INPUT, [[pos, slot, id(d), len(shape), *shape] for pos, slot, d, shape in inputs]),
            (SCALAR, [[pos, address, d == np.float64] for pos, address, d in scalars]),
            (OBJECT, objects))
        self.table = np.zeros(HEAD + sum(size * len(rows) for size, rows in sections),
                              np.int64)
        self.table[:HEAD - 1] = (*(len(rows) for _, rows in sections), id(list),
                                 id(np.ndarray), id(float), id(np.float64), id(np.float32))
        at = HEAD
        for size, rows in sections:
            for row in rows:
                self.table[at:at + len(row)] = row
                at += size
        self.address = self.table.ctypes.data
        self._args = ctypes.c_int64.from_buffer(self.table, ARGS * 8)

    def bind(self, inputs: list) -> None:
        """This call's inputs (alive until the call returns), which the entry refuses
        unless a list long enough."""
        self._args.value = id(inputs)


def emit_guard(mod: ir.Module) -> ir.Function:
    """`ember_guard(ptr table, ptr buffers) -> i64`: nonzero where some record fails; each
    input's data pointer stored in its slot of `buffers`, each scalar in its buffer."""
    fn = ir.Function(mod, ir.FunctionType(I64, [PTR, PTR]), "ember_guard")
    fn.linkage = "internal"
    table, buffers = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    bad = b.alloca(I64, name="bad")
    b.store(i64(0), bad)
    value = b.alloca(REG["f64"], name="value")  # a scalar's, read as a double

    def field(row: ir.Value, k: int | ir.Value) -> ir.Value:
        k = i64(k) if isinstance(k, int) else k
        return b.load(b.gep(row, [k], inbounds=True, source_etype=I64), typ=I64)

    def at(obj: ir.Value, offset: int, typ: ir.Type) -> ir.Value:
        return b.load(b.gep(obj, [i64(offset)], inbounds=True, source_etype=ir.IntType(8)),
                      typ=typ)

    def address(obj: ir.Value, offset: int) -> ir.Value:
        return b.ptrtoint(at(obj, offset, PTR), I64)

    def flag(value: ir.Value) -> None:
        b.store(b.or_(b.load(bad, typ=I64), b.zext(value, I64)), bad)

    def branch(cond: ir.Value, name: str) -> ir.Block:
        """Continue at a new block where `cond` holds; the block after it returned."""
        then, after = b.append_basic_block(name), b.append_basic_block(f"{name}.after")
        b.cbranch(cond, then, after)
        b.position_at_end(then)
        return after

    def join(after: ir.Block) -> None:
        b.branch(after)
        b.position_at_end(after)

    def records(section: int, size: int, body, name: str) -> None:
        """`body(row)` for each record of a section (they follow the earlier ones)."""
        start = i64(HEAD)
        for k, earlier in enumerate((INPUT, SCALAR, OBJECT)[:section]):
            start = b.add(start, b.mul(field(table, k), i64(earlier)))
        for_range(b, i64(0), field(table, section), lambda k: body(b.gep(
            table, [b.add(start, b.mul(k, i64(size)))], inbounds=True, source_etype=I64)),
            name)

    def same_layout(obj: ir.Value, row: ir.Value) -> None:
        """Flag an array whose dtype, ndim or dims are not the record's, or that is not
        C-contiguous and aligned (its strides, which numpy lets a caller set in place)."""
        flags = b.and_(at(obj, FLAGS, I32), ir.Constant(I32, BINDABLE))
        flag(b.icmp_unsigned("!=", flags, ir.Constant(I32, BINDABLE)))
        ndim = field(row, LAYOUT + 1)
        moved = b.or_(b.icmp_unsigned("!=", address(obj, DESCR), field(row, LAYOUT)),
                      b.icmp_unsigned("!=", b.sext(at(obj, NDIM, I32), I64), ndim))
        flag(moved)
        dims = at(obj, DIMS, PTR)

        def dim(j: ir.Value) -> None:
            got = b.load(b.gep(dims, [j], inbounds=True, source_etype=I64), typ=I64)
            flag(b.icmp_unsigned("!=", got, field(row, b.add(j, i64(LAYOUT + 2)))))

        for_range(b, i64(0), b.select(moved, i64(0), ndim), dim, "j")

    # the inputs: a list holding at least every position a record reads (else nothing read)
    args = b.inttoptr(field(table, ARGS), PTR)
    is_list = b.icmp_unsigned("==", address(args, TYPE), field(table, LIST_T))
    flag(b.not_(is_list))
    after_args = branch(is_list, "args")
    size, items = at(args, SIZE, I64), at(args, ITEMS, PTR)

    def item(row: ir.Value, kinds: tuple[int, ...], name: str) -> tuple[ir.Value, ...]:
        """The input at the record's position and its type, where the list holds one and
        it is exactly of a type at `table[kinds]` (else flagged, and the record's fields
        never read); then the blocks to join, innermost first."""
        pos = field(row, 0)
        inside = b.icmp_unsigned("<", pos, size)
        flag(b.not_(inside))
        outer = branch(inside, name)
        obj = b.load(b.gep(items, [pos], inbounds=True, source_etype=PTR), typ=PTR)
        typ = address(obj, TYPE)
        typed = functools.reduce(b.or_, [b.icmp_unsigned("==", typ, field(table, k))
                                         for k in kinds])
        flag(b.not_(typed))
        return obj, typ, (branch(typed, f"{name}.typed"), outer)

    def input_record(row: ir.Value) -> None:
        obj, _, afters = item(row, (ARRAY_T,), "input")
        same_layout(obj, row)
        b.store(at(obj, DATA, PTR), b.gep(buffers, [field(row, 1)], inbounds=True,
                                         source_etype=PTR))
        for after in afters:
            join(after)

    def scalar_record(row: ir.Value) -> None:
        obj, typ, afters = item(row, (FLOAT_T, FLOAT64_T, FLOAT32_T), "scalar")
        with b.if_else(b.icmp_unsigned("==", typ, field(table, FLOAT32_T))) as (single, double):
            with single:  # a numpy.float32: its value, widened exactly
                b.store(b.fpext(at(obj, FLOAT, REG["f32"]), REG["f64"]), value)
            with double:  # a float or numpy.float64 (a float subclass)
                b.store(at(obj, FLOAT, REG["f64"]), value)
        buf = b.inttoptr(field(row, 1), PTR)
        with b.if_else(b.icmp_unsigned("!=", field(row, 2), i64(0))) as (double, single):
            with double:
                b.store(b.load(value, typ=REG["f64"]), buf)
            with single:
                b.store(b.fptrunc(b.load(value, typ=REG["f64"]), REG["f32"]), buf)
        for after in afters:
            join(after)

    records(0, INPUT, input_record, "input")
    records(1, SCALAR, scalar_record, "scalar")
    join(after_args)

    def object_record(row: ir.Value) -> None:
        obj = b.inttoptr(field(row, 0), PTR)
        flag(b.icmp_unsigned(">", b.zext(at(obj, REFCNT, I32), I64), field(row, 1)))
        after = branch(b.icmp_unsigned("!=", field(row, 2), i64(0)), "layout")
        same_layout(obj, row)
        join(after)

    records(2, OBJECT, object_record, "object")
    b.ret(b.load(bad, typ=I64))
    return fn


__all__ = ["FLOATS", "MAX_DIMS", "Guard", "covers", "emit_guard", "native"]
