"""A compiled graph run again and again with some results fed back as the next call's
inputs (a training step's new params and optimizer state), bound once rather than per call.

The fed results and the inputs they become take turns between two sets of the
executable's pooled result buffers: one call reads set A and writes set B, the next reads
B and writes A. Each turn has a buffer table of its own, bound once, so a call binds only
what is new (the batch when it is another array, the lr, the results nobody feeds back),
after two checks that keep `run_values`' contract: every fed input is the very array the
previous call returned for it (`turn.fed`, which a caller that knows where its inputs come
from compares itself and then calls `call`), and no one else holds the arrays it would
write (the pool's refcount rule); a fed array's shape and dtype are checked again too
(either may be set in place, and `run_values` would refuse or convert it). The entry makes
these last two checks itself, from the turn's guard (binding.py), and runs nothing where one
fails; it also binds the tensor inputs, read in place where each is a C-contiguous array
of the dtype and shape bound, and copies the float scalars (an lr, a step count) from the
inputs' list (else the general call converts them). Where the guard cannot read this
interpreter's objects, `call` binds and checks in Python. Any other call runs
`run_values`' general path and binds the two tables again from what that call bound (after
a user replaced a param, on the first calls, while a caller holds a returned array). The
params not fed back (and, without the guard, the tensor inputs) are kept by identity (a
reference held, so an id is never reused) and bound again when another object comes. A
result the caller reads at once and never hands on (a loss it turns into a float) may be
`scratch`: the bound calls write it into one buffer of their own, which needs no pool
entry.
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from operator import attrgetter, is_

import numpy as np

from ....ir.memory_plan import overwritable_operands
from ..codegen import KernelPlan
from ..gemm.matmul import plan_matmul
from .binding import FLOATS, Guard, covers
from .buffers import aligned_empty, data_address
from .rows import Operand

_layout = attrgetter("shape", "dtype", "strides")  # numpy lets a caller set each in place


def _bound_layout(row: Operand) -> tuple:
    """The `_layout` of a C-contiguous array of an argument or param row's shape and dtype
    (numpy's strides: the sizes of the dims after each, times the item's; all 0 when
    empty)."""
    shape, dtype = row.shape, row.dtype
    strides = tuple(0 if 0 in shape else math.prod(shape[i + 1:]) * dtype.itemsize
                    for i in range(len(shape)))
    return shape, dtype, strides


_getrefcount = sys.getrefcount

# references to an array a turn writes, and to its owner (`.base`), while only the pool and
# the turns hold them: the pool entry, the turn's `written` and `results`, the other turn's
# `fed`, getrefcount's argument; the owner: the entry, the array, the turn's `written`, the
# argument (which the native guard's ceilings leave out)
_FREE_ARRAY, _FREE_OWNER = 5, 4


def overwrites(plan: KernelPlan, source: int, target: int) -> bool:
    """Whether the kernels may write result slot `target` over input slot `source`: the
    kernel writing it runs after the loss check (codegen.loss_check: a step that stops
    there has changed nothing) and is the last to read `source`, which it reads only at
    the index it writes (ir/memory_plan.py `overwritable_operands`), and a GEMM does not
    accumulate into `target` before its epilogue reads `source`."""
    last, writers = plan.readers_and_writers
    writer = writers.get(target)
    if writer is None or plan.loss_check is None or writer <= plan.loss_check[0] \
            or last.get(source) != writer:
        return False
    st = plan.steps[writer]
    j = st.outs.index(target)
    if st.op.name == "kernel.matmul" and j == 0 \
            and plan_matmul(st.op, plan.isa, plan.threads).in_place:
        return False
    allowed = overwritable_operands(st.op, j, st.ins)
    return all(k in allowed for k, i in enumerate(st.ins) if i == source)


def _entry(a: np.ndarray) -> tuple:
    """A pool entry's (array, owner, address) for a donated array written in place."""
    return a, a if a.base is None else a.base, data_address(a)


class _Turn:
    """One of the two turns: its table; `fed`, the arrays a call on it must be fed (what the
    last call returned, in the feeds' order) and their layouts; the arrays it writes and
    their owners; `results`, what it returns (None where each call picks a pool entry);
    `guard`, which binds the tensor inputs `args` (`Executable._args`' rows) and the
    float `scalars` (position, buffer address, dtype) and checks in the entry that the
    arrays it writes are free and the fed ones laid out as bound (without `args`, None:
    `call` binds and `free_and_laid_out` checks in Python)."""

    def __init__(self, table, fed: tuple, layouts: list, writes: list, results: list,
                 args: list[Operand] | None, scalars: list, guard_slot: int):
        self.table, self.fed, self.layouts, self.results = table, fed, layouts, results
        self.pointer = ctypes.c_void_p(ctypes.addressof(table))  # cheaper to pass than table
        # the arrays it writes, then their owners: no count is below its floor, so all are
        # free when the counts' sum is the floors'
        self.written = (*(e[0] for e in writes), *(e[1] for e in writes))
        self.free = len(writes) * (_FREE_ARRAY + _FREE_OWNER)
        self.guard = None
        if args is not None:
            self.guard = Guard([(row.key, row.slot, row.dtype, row.shape) for row in args],
                               scalars,
                               [(e[0], _FREE_ARRAY - 1) for e in writes]
                               + [(e[1], _FREE_OWNER - 1) for e in writes], fed)
            table[guard_slot] = self.guard.address

    def free_and_laid_out(self) -> bool:
        """The guard's checks in Python: no one else holds an array this turn writes, and
        every fed array has the layout it was bound with."""
        return sum(map(_getrefcount, self.written)) <= self.free \
            and list(map(_layout, self.fed)) == self.layouts


class Feedback:
    """`run(inputs, values)`: `exe.run_values(inputs, values)`, result for result, for
    a caller that feeds result `r` back as the input `feeds[r]` names (an argument's
    position, or a param's key) on the next call. `turn` is the next call's turn (None
    until a general call bound both), and `call(turn, inputs, values)` that call for a
    caller that found its fed inputs to be `turn.fed`. The turns hold the arrays they
    read and write: a general call drops them first, so that the pool sees who else
    does (a caller must not keep a turn either)."""

    def __init__(self, exe, feeds: Mapping[int, int | str], scratch: Sequence[int] = (),
                 donate: Sequence[int] = ()):
        self.exe = exe
        args = {row.key: row for row in exe._inputs}
        params = {row.key: (j, row) for j, row in enumerate(exe._params)}
        # (not where params are packed: a bound call does not look for a new one to pack)
        self.carries = bool(feeds) and exe._handed is not None and not exe.plan.packs \
            and all(k in args or k in params for k in feeds.values()) \
            and len(set(feeds.values())) == len(feeds) and not set(scratch) & set(feeds) \
            and all(exe.slots[exe._results[r].slot].type == (args[k] if k in args
                                                             else params[k][1]).type
                    for r, k in feeds.items())
        # fed inputs in the feeds' order: (whether an argument, its position among the
        # arguments or the params) and their results' positions
        self._sources = [(True, k) if k in args else (False, params[k][0])
                         for k in feeds.values()]
        self._fed = list(feeds)
        fed_rows = [args[k] if k in args else params[k][1] for k in feeds.values()]
        self._in_slots = [row.slot for row in fed_rows]
        self._fed_layouts = list(map(_bound_layout, fed_rows))
        self._out_slots = [exe._results[r].slot for r in self._fed]
        # the fed pairs (positions in `_fed`) whose result the kernels write over the very
        # input it replaces: one buffer for both turns, updated in place (`overwrites`)
        self._donated = frozenset(k for k, r in enumerate(self._fed) if r in donate and
                                  overwrites(exe.plan, self._in_slots[k], self._out_slots[k]))
        # what each call binds unless it is the object the last call bound
        self._args = [row for row in exe._args if row.key not in feeds.values()]
        self._arg_pos = [row.key for row in self._args]
        self._params = [row for row in exe._params if row.key not in feeds.values()]
        self._value_pos = [params[row.key][0] for row in self._params]
        self._layouts = list(map(_bound_layout, self._params))
        self.binds_params = bool(self._params)  # else `call` reads no value
        self._held_args: list = [None] * len(self._args)
        # whether each turn has a guard (binding.py), and so the arguments the entry binds
        # and checks itself (their type, dtype, shape and layout) on a bound call
        self._guarded = covers([*(shape for shape, *_ in self._fed_layouts),
                                *(row.shape for row in self._args)])
        self.checks_args = frozenset(self._arg_pos) if self._guarded else frozenset()
        # the float scalars (an lr, a step count) the guard copies from the inputs, and
        # those bound in Python: all without a guard
        self._native_scalars: list = []
        self._scalars: list = []
        for row in exe._scalars:
            if row.key in feeds.values():  # a scalar of the optimizer's state
                continue
            if self._guarded and row.dtype in FLOATS:
                self._native_scalars.append((row.key, ctypes.addressof(row.buffer), row.dtype))
            else:
                self._scalars.append(row)
        self._held_values: list = [None] * len(self._params)
        self._kept: dict[int, np.ndarray] = {}  # slot -> the array bound there (converted)
        self._pool_of = dict(exe._pools)
        # scratch results: (position, slot, its buffer and address), shared by both turns
        self._scratch = [(r, exe._results[r].slot,
                          *aligned_empty(exe.slots[exe._results[r].slot].type))
                         for r in scratch]
        self._pools = [(r, row.slot, self._pool_of[row.slot])
                       for r, row in enumerate(exe._results) if r not in feeds and r not in scratch]
        self.turn: _Turn | None = None
        self._other: _Turn | None = None  # the turn after it
        self._tables: list | None = None

    def __call__(self, inputs: Sequence, values: Sequence,
                 owned: frozenset[int] = frozenset()) -> list[np.ndarray]:
        """`owned`: the ids of fed arrays that the caller gives up to be written over on a
        general call (a Param's initial value, zero optimizer state: the first step then
        updates in place as every later one does, instead of holding both)."""
        results = self._bound(inputs, values)
        return self._general(inputs, values, owned) if results is None else results

    def _bound(self, inputs: Sequence, values: Sequence) -> list[np.ndarray] | None:
        """The bound call, where every fed input is its turn's; else None."""
        turn, exe = self.turn, self.exe
        if turn is None or len(inputs) != exe._n_args or len(values) != len(exe.param_keys) \
                or not all(map(is_, [inputs[k] if arg else values[k]
                                     for arg, k in self._sources], turn.fed)):
            return None
        results = self.call(turn, inputs, values)
        if results is not None:
            results = list(results)  # the caller's: a copy of the scratch ones too
            for r, *_ in self._scratch:
                results[r] = results[r].copy()
        return results

    def call(self, turn: _Turn, inputs: Sequence, values: Sequence) -> list | None:
        """The call on `turn` for a caller that found every fed input to be the array of
        `turn.fed`: the results (read only: the list and the scratch results are valid
        until the next call), or None
        without a call when `turn` is not the next call's turn, an array it writes is held
        or a fed array's layout changed. `inputs` and `values` as `__call__` takes them;
        the fed ones are not read (so may be left out at the end), nor `values` unless
        `binds_params`."""
        exe = self.exe
        with exe._lock:
            if turn is not self.turn or (turn.guard is None and not turn.free_and_laid_out()):
                return None  # not the next turn, an array it writes held, a layout changed
            if self._scalars:
                exe._bind_scalars(inputs, self._scalars)
            if turn.guard is not None:  # the entry binds the tensor inputs and float scalars
                if type(inputs) is not list:
                    inputs = list(inputs)  # what the guard reads (held until the call ends)
                turn.guard.bind(inputs)
            elif self._args:  # (only where no guard can be: a few Python checks a call)
                self._bind(inputs, self._args, self._arg_pos, self._held_args)
            if self._params:
                params = list(map(values.__getitem__, self._value_pos))
                if not (all(map(is_, params, self._held_values))
                        and list(map(_layout, params)) == self._layouts):
                    self._bind(values, self._params, self._value_pos, self._held_values,
                               params=True)
            if self._pools:
                taken = [exe._take(i, pool) for _, i, pool in self._pools]
                for (_, i, _), entry in zip(self._pools, taken):
                    turn.table[i] = entry[2]
            if not exe._call(turn.pointer):  # the guard's checks failed (no reference here
                return None                  # to an array it counts)
            self.turn, self._other = self._other, turn
            if not self._pools:  # the turn's own list: its caller only reads it
                return turn.results
            results = turn.results.copy()
            for (r, _, _), entry in zip(self._pools, taken):
                results[r] = entry[0]
            return results

    def _bind(self, source: Sequence, rows: list[Operand], positions: list, held: list,
              params: bool = False) -> None:
        """Bind `source`'s values at `positions` to their slots in both turns' tables: every
        param (one changed its layout, perhaps in place), the arguments that are new."""
        tables = self.turn.table, self._other.table
        for k, (row, pos) in enumerate(zip(rows, positions)):
            x = source[pos]
            if not params and x is held[k] is not None \
                    and tables[0][row.slot] == data_address(x):
                continue  # bound already (its shape is the caller's to check: a graph's key;
                # its data may have moved: `resize(refcheck=False)`)
            if x is None and params:
                raise KeyError(f"no value for {row.what}")
            bound, address = self.exe._bind(x, row)
            tables[0][row.slot] = tables[1][row.slot] = address
            self._kept[row.slot] = bound
            held[k] = x if bound is x else None  # a converted copy is made again next call

    def _spare(self, slot: int, used: set) -> tuple:
        """A pool entry of result slot `slot` whose id is not in `used` (a new one if
        none)."""
        pool = self._pool_of[slot]
        spare = next((e for e in pool if id(e) not in used), None)
        return spare if spare is not None else self.exe._new_result(slot, pool)

    def _general(self, inputs: Sequence, values: Sequence,
                 owned: frozenset[int] = frozenset()) -> list[np.ndarray]:
        """`run_values`, then both turns bound again from what it bound. A donated input
        that the turns held (an array this feedback made, never a caller's own, which a
        clone may share) or that the caller gave up (`owned`) is written over here too:
        it stays its Param's array, current. An array fed twice is never written over."""
        exe = self.exe
        ours = owned | {id(a) for t in (self.turn, self._other) if t is not None for a in t.fed}
        self.turn = self._other = None  # their references are not the caller's
        into = {}
        if len(inputs) == exe._n_args and len(values) == len(exe.param_keys):  # (else _run
            fed = [inputs[pos] if arg else values[pos] for arg, pos in self._sources]  # says)
            twice = {k for k, n in Counter(map(id, fed)).items() if n > 1}
            for k in self._donated:
                x = fed[k]
                if id(x) in ours and id(x) not in twice \
                        and _layout(x) == self._fed_layouts[k]:  # (as bound, not reshaped
                    into[self._out_slots[k]] = x  # or restrided in place since)
        arrays = exe._run(inputs, values, into)
        results = exe._collect(arrays)
        if self.carries:
            self._bind_turns(inputs, values, arrays, results)
        return results

    def _bind_turns(self, inputs, values, arrays: list, results: list) -> None:
        """The next call reads the fed results and writes the buffers this one read (or,
        where it read a caller's array or one buffer twice, another of the pool's); the
        one after it the other way round. None when a result is not one of the pool's (all
        of them held)."""
        pooled = self.exe._pooled
        reads = [pooled.get(id(results[r])) or (_entry(results[r]) if k in self._donated
                                                else None) for k, r in enumerate(self._fed)]
        if any(e is None for e in reads):
            return
        writes: list = []
        used = set(map(id, reads))
        for k, (i, o) in enumerate(zip(self._in_slots, self._out_slots)):
            if k in self._donated:  # read and written in place: what this call returned
                writes.append(reads[k])
                continue
            e = pooled.get(id(arrays[i]))
            if e is None or id(e) in used:
                e = self._spare(o, used)
            writes.append(e)
            used.add(id(e))
        ptrs = self.exe._ptrs
        if self._tables is None:  # allocated once: a general call binds them again
            self._tables = [(ctypes.c_void_p * len(ptrs))() for _ in range(2)]
        turns = []
        for table, (r, w) in zip(self._tables, ((reads, writes), (writes, reads))):
            ctypes.memmove(table, ptrs, ctypes.sizeof(table))
            for i, o, er, ew in zip(self._in_slots, self._out_slots, r, w):
                table[i], table[o] = er[2], ew[2]
            returned: list = [None] * len(results)  # each call picks those left
            for pos, e in zip(self._fed, w):
                returned[pos] = e[0]
            for pos, slot, buf, address in self._scratch:
                returned[pos], table[slot] = buf, address
            # the arrays it writes that no one else may hold (a donated one is its caller's)
            free = [e for k, e in enumerate(w) if k not in self._donated]
            turns.append(_Turn(table, tuple(e[0] for e in r), self._fed_layouts, free, returned,
                               self._args if self._guarded else None, self._native_scalars,
                               self.exe.guard_slot))
        self.turn, self._other = turns
        for i in self._in_slots:  # the turns bind these now: the arrays this call read there
            self.exe._held.pop(i, None)  # (initial params, zero optimizer state) may go
            self.exe._ptrs[i] = None  # (a general call binds every slot again)
        self._kept = {}
        for rows, positions, source, held in (
                (self._args, self._arg_pos, inputs, self._held_args),
                (self._params, self._value_pos, values, self._held_values)):
            for k, (row, pos) in enumerate(zip(rows, positions)):
                x = source[pos]
                held[k] = x if arrays[row.slot] is x else None
                self._kept[row.slot] = arrays[row.slot]
