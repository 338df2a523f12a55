"""A compiled graph: native code plus buffers allocated once and reused on every call."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ....cache_store import vouched
from ....files import cache_enabled
from ....ir import Graph, numpy_dtype, verify
from ....ir.printer import print_graph
from ....settings import DUMP_LLVM, PASS_TIMING
from ...input_checks import InputCheckError, describe
from ..codegen import ENTRY, PACK, emit, plan
from ..gemm import blas
from ..machine import cache
from ..machine.jit import JitModule, fingerprint
from . import timing
from .bound import Feedback
from .buffers import aligned_copy, aligned_empty, as_input, data_address, guarding, raw_bytes
from .rows import Operand, Result, ScalarInput


class Executable:
    """`exe(inputs, params)` runs the graph natively and returns fresh arrays;
    `run_values(inputs, values)` is the same call with the params' values listed in
    `param_keys` order, for a runtime that binds the same params on every step;
    `feedback(feeds)` makes that call for a runtime that also feeds results back as the
    next call's inputs (a training step's params and optimizer state), bound once
    (bound.py).

    Intermediate buffers are allocated once and overwritten by every call (a lock
    serializes concurrent calls; a forked child gets a new one): the op results the graph
    does not return and the kernels' scratch share one arena at the memory plan's offsets
    (MemoryError at compile time when it cannot be allocated); `memory()` says how many
    bytes each role takes. An op result that the graph returns is instead written straight
    into an array the caller then owns: one this executable returned before and nobody
    holds any more (a training step's previous params), else a new one; no copy.
    Returned inputs, params and constants, and a buffer returned twice, are copied. Each
    call is exactly one native call (`native_calls` counts them). `timings` holds the
    compile time per stage (printed with `EMBER_PASS_TIMING=1`), `cached` whether the
    object code came from the compile cache (under `cache_key`; None when not cached). A
    graph the stage cache vouches for (cache_store.vouching) is neither verified (the passes
    did) nor printed for its key (its digest names it) again.
    `profile(inputs, params)` times each kernel inside one native call (timing.py).

    A graph marked `ember.constant_params` (an inference graph) has each GEMM read its
    weight (a param it would pack on every call) from panels packed ahead of the call: a
    buffer of their own per param (`memory()["packed"]`), written when a call binds an array
    for that param other than the one last packed, or after `params_changed()`, which a
    caller that changes a bound array in place must call (the runtime does when a Param
    was rebound or a training step updated it in place); `packings` counts them.
    """

    # every input check the graph asks for (input_checks) runs in the entry, none where
    # it asks for none: the runtime then checks nothing in Python either
    checks_inputs = True
    takes_params_as_bound = True  # (`__call__`'s `params_as_bound`)

    def __init__(self, graph: Graph, threads: int | None = None, use_cache: bool | None = None):
        t0 = time.perf_counter()
        digest = vouched(graph)  # the stage cache's word: verified by the passes, and named
        self.graph = graph if digest is not None else verify(graph)
        self.plan = plan(graph, threads)
        self._arena = self._allocate_arena()  # before the costly part: fail fast
        self.timings: dict[str, float] = {"plan": time.perf_counter() - t0}
        use_cache = cache_enabled() if use_cache is None else use_cache
        use_cache = use_cache and DUMP_LLVM.get() is None  # dumps need a build
        # the input checks are compiled in, but live in the func attributes the key blanks
        options = f"{cache.options(self.plan.threads)} checks={self.plan.checks}"
        k = None
        if use_cache:  # a vouched-for graph's digest saves printing it
            k = (cache.key_of_digest(digest, fingerprint(), options) if digest is not None
                 else cache.key(print_graph(graph), fingerprint(), options))
        self.cache_key = k
        self._jit = cache.load_jit(k) if k else None
        self.cached = self._jit is not None
        if self._jit is None:  # the LLVM module is not kept: `llvm_ir` emits it again
            t = time.perf_counter()
            module = emit(self.plan, graph.name)
            self.timings["emit"] = time.perf_counter() - t
            self._jit = JitModule(module, name=graph.name)
            del module
            if k:
                cache.store(k, self._jit.object_code)
        self.timings.update(self._jit.timings)
        self.slots, self.outputs = self.plan.slots, self.plan.outputs
        self._n_args = len(graph.args)
        self._entry = self._jit.function(ENTRY, ctypes.c_int64, ctypes.c_void_p)
        fresh = {i for i, _ in self.outputs if self.slots[i].kind == "temp"}
        self._fresh = sorted(fresh)
        # fixed buffers: constants, intermediates, scratch; None where each call binds its own
        self._arrays = [self._fixed(i, s, fresh) for i, s in enumerate(self.slots)]
        # one pointer per slot, then the guard's (none: a bound call's table sets it)
        self.guard_slot = len(self.slots)
        self._ptrs = (ctypes.c_void_p * (len(self.slots) + 1))(
            *[a.ctypes.data if a is not None else None for a in self._arrays])
        self._table = ctypes.c_void_p(ctypes.addressof(self._ptrs))  # cheaper to pass
        bound = [(i, s) for i, s in enumerate(self.slots) if s.kind in ("arg", "param")]
        # scalar inputs (a learning rate, a step count) go into buffers of their own, each
        # written through its `value` (_scalar_buffer), with the Python and numpy types it
        # takes as they are
        self._scalars = [ScalarInput(s.key, self._scalar_buffer(i, s),
                                     _SCALARS.get(numpy_dtype(s.type.dtype).kind, ()),
                                     numpy_dtype(s.type.dtype), s.type, self._describe(s))
                         for i, s in bound if s.kind == "arg" and s.type.shape == ()]
        # inputs (by position) and params in `param_keys` order (as `run_values` and `_run`
        # take their values); the tensor inputs
        rows = [Operand(i, s.key, numpy_dtype(s.type.dtype), s.type.shape, s.type,
                        self._describe(s)) for i, s in bound]
        self._inputs = [row for row, (_, s) in zip(rows, bound) if s.kind == "arg"]
        self._args = [row for row in self._inputs if row.shape]
        self._params = [row for row, (_, s) in zip(rows, bound) if s.kind == "param"]
        self.param_keys = tuple(row.key for row in self._params)
        # each result: a fresh buffer is handed over the first time it is returned,
        # anything else is copied
        self._results, handed = [], set()
        for i, t in self.outputs:
            own = i in fresh and i not in handed
            handed.add(i)
            self._results.append(Result(i, t.shape if self.slots[i].type.shape != t.shape
                                        else None, own))
        # the results' slots when each is handed over as it is (no copy, no reshape)
        self._handed = [row.slot for row in self._results] \
            if all(row.own and row.shape is None for row in self._results) else None
        # id -> pool entry (array, owner, address) of every pooled result: a training step
        # binds them as its next params, and their address is known already (the entry is
        # shared with the pool, so the refcounts _run reads to recycle them stay as they were)
        self._pooled: dict[int, tuple] = {}
        # slot -> (array, address) of the caller's array the last call bound there as it
        # was: the same array (held here, so its memory cannot move) is bound again without
        # a look at it
        self._held: dict[int, tuple] = {}
        self._pools = [(i, []) for i in self._fresh]  # (slot, its returned results' entries)
        self._status = None
        if self.plan.checked:
            addr = self._jit.engine.get_global_value_address("ember_status")
            self._status = ctypes.c_int64.from_address(addr)
        # the array each packed param's panels were last written from, and its address
        self._packed_from: list[tuple | None] = [None] * len(self.plan.packs)
        self._pack = (self._jit.function(PACK, None, ctypes.c_void_p, ctypes.c_int64)
                      if self.plan.packs else None)
        self.packings = 0
        self._lock = threading.Lock()
        _live.add(self)
        self.native_calls = 0
        self.writes_out = True  # __call__ takes out=
        self.timings["total"] = time.perf_counter() - t0
        if PASS_TIMING.get():  # the backend's stages, as --pass-timing
            print(f"@{graph.name}:\n{self.timing_report()}", file=sys.stderr)

    def _scalar_buffer(self, i, s) -> ctypes._SimpleCData | _Scalar:
        """Scalar inputs (a learning rate, a step count) are copied into a buffer of their
        own, whose address the table keeps: cheaper than converting a new array per call.
        What is returned writes it through `.value`: a ctypes float over the buffer for the
        float dtypes C has (a third of numpy's `buf[()] = x` per step; C's conversion of a
        double rounds as numpy's does), else the buffer itself behind `_Scalar`."""
        buf = aligned_empty(s.type)[0]
        buf[()] = 0
        self._arrays[i] = buf
        self._ptrs[i] = buf.ctypes.data
        c_type = _C_FLOATS.get(buf.dtype)
        return _Scalar(buf) if c_type is None else c_type.from_address(buf.ctypes.data)

    def _allocate_arena(self) -> np.ndarray | None:
        """The temporaries' arena; None inside `guarded()`, where each temporary gets a
        buffer of its own that ends at a guard page, so an overflow of any of them faults."""
        if guarding():
            return None
        n = self.plan.arena
        try:
            return raw_bytes(n)
        except MemoryError:
            raise MemoryError(f"@{self.graph.name}: the memory plan needs an arena of {n:,} "
                              f"bytes ({n / 2**20:,.1f} MiB) for its temporaries, which "
                              "cannot be allocated; nothing has run") from None

    def _fixed(self, i, s, fresh):
        if s.kind == "const":
            return aligned_copy(s.value, s.type)
        if s.kind == "packed":
            return aligned_empty(s.type)[0]
        if s.kind not in ("temp", "scratch") or i in fresh:
            return None
        n = s.type.nbytes
        if self._arena is None:
            raw = raw_bytes(n)
        else:
            raw = self._arena[s.offset:s.offset + n]
        return raw if s.kind == "scratch" else \
            raw.view(numpy_dtype(s.type.dtype)).reshape(s.type.shape)

    def memory(self) -> dict[str, int]:
        """Bytes this executable holds, by role: `arena` (temporaries and kernel scratch:
        one buffer each inside `guarded()`), `constants`, `packed` (params packed for the
        GEMMs that read them), `scalars` (copies of scalar inputs), `results` (the buffer
        each returned op result is written into per call), and their `total`. Inputs and
        params are the caller's and not counted."""
        fresh = set(self._fresh)
        own = sum(self._arrays[i].nbytes for i, s in enumerate(self.slots)
                  if s.kind in ("temp", "scratch") and i not in fresh)
        out = {"arena": own if self._arena is None else self._arena.nbytes,
               "constants": sum(a.nbytes for a, s in zip(self._arrays, self.slots)
                                if s.kind == "const"),
               "packed": sum(self.slots[pk.slot].type.nbytes for pk in self.plan.packs),
               "scalars": sum(row.type.nbytes for row in self._scalars),
               "results": sum(self.slots[i].type.nbytes for i in fresh)}
        out["total"] = sum(out.values())
        return out

    @property
    def direct_results(self) -> frozenset[int]:
        """The result positions whose kernels write straight into an `out=` array (the
        others are copied there once the run is over)."""
        return frozenset(k for k, row in enumerate(self._results) if row.own)

    @property
    def llvm_ir(self) -> str:
        """The LLVM IR generated for this graph (before optimization), emitted again from
        the plan on every read (`emit` is deterministic): neither the module nor its text
        outlives a compile."""
        return str(emit(self.plan, self.graph.name))

    def _new_result(self, i: int, pool: list) -> tuple:
        """A new buffer for returned result `i`, kept in its `pool` (up to 3) to be recycled:
        `_run` hands out a pooled buffer again once nobody references it (a training step's
        previous parameters, once the runtime replaced them), which skips the page faults of
        fresh memory (~0.1 ms per step for a few MB of parameters)."""
        a, addr = aligned_empty(self.slots[i].type)
        entry = (a, a.base, addr)
        if len(pool) < 3:
            pool.append(entry)
            self._pooled[id(a)] = entry
        return entry

    def _raise_status(self) -> None:
        code, self._status.value = self._status.value, 0
        if code < 0:
            check = self.plan.checks[-code - 1]
            raise InputCheckError(check[0], describe(check))
        st = self.plan.steps[code - 1]
        t = st.op.operands[0].type if st.op.name == "ember.gather" else st.op.result.type
        raise IndexError(f"{st.op.name} (kernel {st.name}): an index is out of range for a "
                         f"table of {t.shape[0]} rows")

    # timing (timing.py)
    def bound(self, inputs, params=None) -> Callable[[], None]:
        """The native call alone, its buffers bound once: what benchmarks time."""
        return timing.bound(self, inputs, params)

    def profile(self, inputs, params=None, repeat: int = 20) -> list[tuple[str, float]]:
        """Seconds per kernel (median of `repeat` runs) inside one native call."""
        return timing.profile(self, inputs, params, repeat)

    def kernel_timer(self, inputs, params=None) -> timing.KernelTimer:
        """`profile`'s runs one at a time."""
        return timing.kernel_timer(self, inputs, params)

    def timing_report(self) -> str:
        """Compile time per stage, as `--pass-timing` prints it."""
        return timing.timing_report(self)

    @staticmethod
    def _describe(s) -> str:
        if s.kind == "arg":
            return f"input {s.key}" + (f" ({s.path})" if s.path else "")
        return f"param {s.path} (id {s.key})"

    def __call__(self, inputs: Sequence[np.ndarray],
                 params: Mapping[str, np.ndarray] | None = None,
                 out: Mapping[int, np.ndarray] | None = None,
                 params_as_bound: bool = False) -> list[np.ndarray]:
        """`out`: {result position: array} to write those results into (C-contiguous, of
        the result's dtype and size): a data-parallel step's flat gradient buffer. A result
        the kernels write directly is written there; any other is copied there.
        `params_as_bound`: the caller vouches that params that are the arrays the last
        call bound were not resized in place since (a runtime whose Params, read-only,
        were not rebound: `Edits.values`), so they are not looked at again."""
        into = self._bind_out(out) if out else None
        results = self._collect(self._run(inputs, self._values(params), into,
                                          params_as_bound))
        for k, target in out.items() if out else ():
            if results[k].ctypes.data != target.ctypes.data:
                np.copyto(target.reshape(results[k].shape), results[k])
            results[k] = target.reshape(results[k].shape)
        return results

    def run_values(self, inputs: Sequence, values: Sequence) -> list[np.ndarray]:
        """`exe(inputs, params)` with the params' values listed in `param_keys` order: what a
        runtime that binds the same params on every step calls (no mapping read per call)."""
        return self._collect(self._run(inputs, values))

    def feedback(self, feeds: Mapping[int, int | str], scratch: Sequence[int] = (),
                 donate: Sequence[int] = ()) -> Feedback:
        """`run_values` for a caller that feeds result `r` back as the next call's input
        `feeds[r]` (an argument's position or a param's key): bound once, not per call;
        `scratch`: results it reads at once and never keeps; `donate`: fed results the
        kernels may write over the input they replace where the schedule allows (a
        training step's params and optimizer state, updated in place) (bound.py)."""
        return Feedback(self, feeds, scratch, donate)

    def _values(self, params: Mapping | None) -> list:
        """The values of `param_keys` in `params` (None where it has none)."""
        if not params:
            return [None] * len(self.param_keys)
        return [params.get(key) for key in self.param_keys]

    def _collect(self, arrays: list) -> list[np.ndarray]:
        """One call's results from its slots' arrays: handed over, else reshaped or copied."""
        if self._handed is not None:
            return [arrays[i] for i in self._handed]
        return [arrays[r.slot] if r.own and r.shape is None else
                arrays[r.slot].reshape(r.shape) if r.own else
                (arrays[r.slot] if r.shape is None else arrays[r.slot].reshape(r.shape)).copy()
                for r in self._results]

    def _bind_out(self, out: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """{slot: array viewed as the slot's type} for the results the kernels write."""
        into = {}
        for k, target in out.items():
            result = self._results[k]
            i = result.slot
            t = self.slots[i].type
            if not (target.flags.c_contiguous and target.dtype == numpy_dtype(t.dtype)
                    and target.size == t.size):
                raise ValueError(f"out[{k}]: needs a C-contiguous {t} buffer, got "
                                 f"{target.dtype} of shape {target.shape}")
            if result.own:
                into[i] = target.reshape(t.shape)
        return into

    def _run(self, inputs, values, into: dict | None = None, as_bound: bool = False) -> list:
        """Bind and run: every slot's array (inputs as converted, results) of this call;
        `values`: the params' in `param_keys` order; `into` gives some results' slots the
        caller's arrays; `as_bound`: see `__call__`'s `params_as_bound`."""
        if len(inputs) != self._n_args:
            raise ValueError(f"graph @{self.graph.name} takes {self._n_args} inputs, "
                             f"got {len(inputs)}")
        if len(values) != len(self.param_keys):
            raise ValueError(f"graph @{self.graph.name} takes {len(self.param_keys)} params, "
                             f"got {len(values)}")
        arrays = self._arrays.copy()
        with self._lock:
            table = self._ptrs
            self._bind_scalars(inputs)
            for row in self._args:
                arrays[row.slot], table[row.slot] = self._bind(inputs[row.key], row)
            if not (as_bound and self._held_as_bound(values, arrays)):
                self._bind_params(values, arrays, table)
            for i, pool in self._pools:
                if into and i in into:
                    arrays[i] = into[i]
                    table[i] = into[i].ctypes.data
                    continue
                entry = self._take(i, pool)
                arrays[i], table[i] = entry[0], entry[2]
            self._call(self._table)
        return arrays

    def _bind_params(self, values, arrays: list, table) -> None:
        """Bind each param, and pack those some GEMM reads packed."""
        for row, x in zip(self._params, values):
            if x is None:
                raise KeyError(f"no value for {row.what}")
            arrays[row.slot], table[row.slot] = self._bind(x, row)
        if self._pack is not None:
            self._pack_changed(arrays)

    def _held_as_bound(self, values, arrays: list) -> bool:
        """For an `as_bound` call: whether each param is the array its slot holds as the
        last call bound it (`_held`: its address is still in the table, its panels
        packed), putting them in `arrays`; False where one is not (bind them all)."""
        held = self._held
        for row, x in zip(self._params, values):
            kept = held.get(row.slot)
            if kept is None or kept[0] is not x:
                return False
            arrays[row.slot] = x
        return True

    def params_changed(self) -> None:
        """The params' arrays may have changed in place: the next call packs them again."""
        self._packed_from = [None] * len(self._packed_from)

    def _pack_changed(self, arrays: list) -> None:
        """Pack each param some GEMM reads packed whose bound array is not the one its
        panels hold (held here, so that its id cannot be another array's); the lock held."""
        for k, pk in enumerate(self.plan.packs):
            bound = (arrays[pk.source], self._ptrs[pk.source])
            last = self._packed_from[k]
            if last is None or last[0] is not bound[0] or last[1] != bound[1]:
                self._pack(self._table, k)
                self._packed_from[k] = bound
                self.packings += 1

    def _bind_scalars(self, inputs, rows: list[ScalarInput] | None = None) -> None:
        """Copy the scalar inputs (of `rows`, or all) into their buffers."""
        for row in self._scalars if rows is None else rows:
            x = inputs[row.key]
            row.buffer.value = x if type(x) in row.takes \
                else as_input(x, row.type, row.dtype, row.what)

    def _bind(self, x, row: Operand) -> tuple[np.ndarray, int]:
        """A tensor input or param as the native code reads it, and its address: an array
        this executable returned (the pool keeps it alive, so its id is its own) is
        C-contiguous and aligned, its address known; the caller's array is kept alive while
        bound (`_held`), its address read on every bind (`resize(refcheck=False)` moves its
        data in place). Neither a converted copy (made again from what the caller
        has now) nor a pooled result (a reference would keep the pool from recycling it)
        is held."""
        laid_out = type(x) is np.ndarray and x.dtype is row.dtype and x.shape == row.shape \
            and x.flags.c_contiguous  # numpy lets a caller set shape, dtype, strides in place
        known = self._pooled.get(id(x))
        if known is not None and laid_out:
            self._held.pop(row.slot, None)
            return x, known[2]
        if not laid_out:
            self._held.pop(row.slot, None)
            y = as_input(x, row.type, row.dtype, row.what)
            return y, data_address(y)
        bound = self._held[row.slot] = (x, data_address(x))
        return bound

    def _take(self, i: int, pool: list) -> tuple:
        """A pool entry of result slot `i` nobody holds, else a new one."""
        getrefcount = sys.getrefcount
        for entry in pool:
            # free when only the pool refers to the array and to its memory (a view a
            # caller kept refers to the owning buffer `entry[1]`: numpy collapses bases)
            if getrefcount(entry[0]) <= _FREE_ARRAY and getrefcount(entry[1]) <= _FREE_OWNER:
                return entry
        return self._new_result(i, pool)

    def _call(self, table: ctypes.c_void_p) -> bool:
        """The native call on a bound table (its address; the lock held); raises what its
        status says. False where the table's guard refused it: nothing ran."""
        if self._entry(table):
            return False
        self.native_calls += 1
        if self._status is not None and self._status.value:
            self._raise_status()
        return True


_live: weakref.WeakSet[Executable] = weakref.WeakSet()


def _unlock_in_child() -> None:
    """A forked child has only the thread that forked: a lock another thread held while
    inside a call would never be released, and the child's first call would hang (its
    buffers are the child's own copies, so a new lock is all it needs). A call that was
    in flight may also have been inside OpenBLAS, whose threaded GEMM holds a lock of its
    own that nothing re-creates: then the child's BLAS runs on one thread, as its parallel
    loops do (parallel/pool.py)."""
    in_flight = False
    for exe in _live:
        in_flight |= exe._lock.locked()
        exe._lock = threading.Lock()
    lib = blas.find() if in_flight else None  # cached: every JitModule looked it up
    if lib is not None and lib.set_threads is not None:
        lib.set_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_unlock_in_child)

# references to a pooled (array, owner, address) entry's array and owner while only the
# pool holds them: the entry tuple, (the array's .base,) getrefcount's argument (called
# as `_take` calls it)
_FREE_ARRAY, _FREE_OWNER = 2, 3

_SCALARS = {"f": (float, int, np.float32, np.float64, np.int64), "i": (int, np.int64, np.int32),
            "b": (bool, np.bool_)}
_C_FLOATS = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


class _Scalar:
    """A 0-d buffer written through `.value`, as a ctypes scalar is (numpy's casts)."""

    __slots__ = ("buf",)

    def __init__(self, buf: np.ndarray):
        self.buf = buf

    @property
    def value(self):
        return self.buf[()]

    @value.setter
    def value(self, x) -> None:
        self.buf[()] = x


