"""Compiled functions: the cache, checks and runs every compiled model shares (`Compiled`),
and inference (`CompiledFunction`); gradients and training steps are steps.py's.

Each keeps a cache keyed by the input shapes and the model's params state (flags,
requires_grad): a change recompiles, with a one-line notice, and never runs a stale graph.
A call like the last one (the common case: a training loop) finds its graph by checking
the last key's parts again, cheaply, rather than by building the key (`_LastKey`).

The runtime reads the graph roles the tracer and the passes leave on the graph:
`ember.rng` (the argument fed with the step counter, for dropout), `ember.buffer_updates`
(results that are new values of buffers such as BatchNorm's running stats, written back
after the step), `ember.grads`, `ember.updates` and `ember.state` (optimizer pass). It
leaves its own before compiling: `ember.finite_args` and `ember.label_args`, the input
checks a backend may run natively (backends/input_checks.py), and on an inference graph
`ember.constant_params`: the params change only between calls, so a backend may keep
copies of them laid out for its kernels (the cpu backend's packed GEMM weights), which the
runtime tells it to make again once a Param was rebound (`CompiledFunction.run`).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter

import numpy as np

from ..backends.errors import UnsupportedFusionError
from ..cache_store import vouching
from ..frontend.module import Module
from ..frontend.param import Edits
from ..frontend.trace import ShapeError, TensorSpec, trace_function
from ..ir import Graph, numpy_dtype
from ..ir.parser import parse
from ..settings import DUMP_IR
from . import debug, stage_cache
from .backend import DEVICE_BACKENDS, get_backend, to_host
from .debug import AnomalyError, ExecutionError
from .fast_path import BoundStep
from .inputs import check_labels, label_inputs
from .inspect_compiled import Inspectable
from .params import ParamTable, StateWatch, param_values, state_key
from .pipeline import Stages, inference_pipeline, with_low_precision, without_fusion
from .update import UpdateLayout


@dataclass
class Entry:
    """One compiled graph, what produced it, and where its roles sit among args/results."""

    graph: Graph
    run: Callable
    stages: Stages
    compile_seconds: float
    specs: tuple = field(default_factory=tuple)
    labels: tuple = ()  # (input index, number of classes) of each input of labels
    _replay: Graph | None = None
    bound: BoundStep | None = None  # a training step's call path on it (runtime/fast_path.py)
    values_seen: int = -1  # `Edits.values` at its last run (CompiledFunction.run)

    def replay_graph(self) -> Graph:
        """What the interpreter replays to find a failing op: the graph before fusion."""
        if self._replay is None:
            self._replay = self.stages.unfused()
        return self._replay

    @cached_property
    def rng_index(self) -> int | None:
        i = self.graph.attributes.get("ember.rng")
        return None if i is None else int(i)

    @cached_property
    def buffer_ids(self) -> list[str]:
        return list(self.graph.attributes.get("ember.buffer_updates", ()))

    @cached_property
    def native_checks(self) -> bool:
        """Whether the backend runs the graph's input checks itself (before any kernel)."""
        return bool(getattr(self.run, "checks_inputs", False))

    @cached_property
    def update_layout(self) -> UpdateLayout:
        return UpdateLayout.of(self.graph)

    @cached_property
    def tail(self) -> int:
        """How many results at the end are gradients or new params and optimizer state."""
        a = self.graph.attributes
        if "ember.updates" in a:
            return len(a["ember.updates"]) + len(a.get("ember.state", ()))
        return len(a.get("ember.grads", ()))

    @cached_property
    def cuts(self) -> tuple[int, int]:
        """Where the user results and the new buffer values end among a run's results."""
        body = len(self.graph.return_op.operands) - self.tail
        return body - len(self.buffer_ids), body

    def split(self, outs: list) -> tuple[list, list, list]:
        """(user results, new buffer values, tail) of one run's results."""
        user, body = self.cuts
        return outs[:user], outs[user:body], outs[body:]


@dataclass
class _LastKey:
    """The last call's cache key in parts that are cheap to check again: a call with the
    same inputs' types, shapes and dtypes, the same param table in the same state
    (`StateWatch`) and the same settings (`watch_settings`) finds its graph without
    rebuilding the key (`Compiled.entry` checks them inline: it runs on every step)."""

    entry: Entry
    inputs: tuple | None
    state: StateWatch
    settings_unchanged: Callable[[], bool]

    def matches(self, inputs: tuple, table: dict) -> bool:
        """Whether a call with `inputs` on `table` has this key."""
        read = _inputs_read(inputs)
        return read is not None and read == self.inputs and self.unchanged(table)

    def unchanged(self, table: dict) -> bool:
        """`matches` but for the inputs, for a caller whose backend checks those."""
        return self.state.unchanged(table) and self.settings_unchanged()


def one_call_at_a_time(call: Callable) -> Callable:
    """A compiled object's `__call__`, run by one thread at a time: a call rebinds the
    params, feeds the buffers and tables of the native code and counts steps, none of which
    two calls may interleave (two threads calling one step crashed in native code).
    Different objects still run at once."""
    @functools.wraps(call)
    def serialized(self, *inputs):
        with self._calls:
            return call(self, *inputs)
    return serialized


class Compiled(Inspectable):
    """Shared machinery: specs → trace → pipeline → backend, cached by key; what it shows
    of itself (stages, IR, profile, repr) is `Inspectable`'s (inspect_compiled.py).

    The cache keeps the `cache_size` most recently used compiled graphs (one per input
    shapes, flags and optimizer settings; settable per object, as torch.compile's
    `cache_size_limit`): a run over many batch sizes holds a few executables, not one per
    size. An evicted graph, or every graph of a deleted object, frees its native code and
    buffers."""

    kind = "forward"
    training = False  # traced as a training trace (dropout active, buffers updated)
    constant_params = False  # the graph never changes a param (`ember.constant_params`)
    cache_size = 8

    def __init__(self, model: Module, backend: str, linear: str = "split",
                 detect_anomaly: bool = False):
        self.model, self.backend_name, self.linear = model, backend, linear
        self.backend = get_backend(backend)
        self.detect_anomaly = detect_anomaly
        self.rng_step = 0  # fed to the graph's `ember.rng` argument; counts runs
        self.rng_shard = 0  # its high 32 bits: a data-parallel rank (see interpreter/rng.py)
        # a device backend's results stay there: Params are rebound to them (set_device_value)
        self.on_device = backend in DEVICE_BACKENDS
        self._cache: OrderedDict[tuple, Entry] = OrderedDict()  # least recently used first
        self._last: Entry | None = None
        self._last_key: _LastKey | None = None
        self.param_table = ParamTable(model)
        self.compiles = 0  # graphs compiled so far (a cache miss each)
        self._calls = threading.RLock()  # held by a call (see `one_call_at_a_time`)

    # subclasses: the function to trace and the pipeline to run
    def traced_fn(self) -> Callable:
        raise NotImplementedError

    def pipeline(self) -> list[str]:
        raise NotImplementedError

    def key_extra(self) -> tuple:
        """What else a compiled graph bakes in (an optimizer's hyper-parameters)."""
        return ()

    def watch_settings(self) -> Callable[[], bool]:
        """A check, run on every call, that `key_extra()` is still what it is now (a
        subclass may make it cheaper than building the key again)."""
        extra = self.key_extra()
        return lambda: self.key_extra() == extra

    def entry(self, inputs: tuple, table: dict | None = None) -> Entry:
        table = self.param_table() if table is None else table
        last = self._last_key
        if last is not None and last.matches(inputs, table):
            return last.entry  # the most recently used already
        inputs_read = _inputs_read(inputs)
        shapes = tuple(map(_shape_and_dtype, inputs))
        state, settings = StateWatch(table), self.watch_settings()
        key = (shapes, state_key(table), self.key_extra())
        entry = self._cache.get(key)
        if entry is not None:
            self._cache.move_to_end(key)
        else:
            self.check_new_inputs(inputs)
            specs = tuple(TensorSpec.of(x) for x in inputs)
            why = None if self._last is None else self.recompile_reason(self._last, specs)
            if why is not None:
                print(f"ember: recompiling {self.kind} ({why})", file=sys.stderr)
            entry = self._compile(specs)
            self._cache[key] = entry
            while len(self._cache) > max(1, self.cache_size):
                self._cache.popitem(last=False)
        self._last = entry
        self._last_key = _LastKey(entry, inputs_read, state, settings)
        return entry

    def check_new_inputs(self, inputs: tuple) -> None:
        """Checks of input shapes before they are traced (a compiled key passed them)."""

    def recompile_reason(self, last: Entry, specs: tuple) -> str | None:
        """What the notice of a compile after `last` says (None: no notice)."""
        was, now = self.shapes_text(last.specs), self.shapes_text(specs)
        return ("inputs " + now + "; was " + was if was != now
                else "model flags, requires_grad or optimizer settings changed")

    def shapes_text(self, specs: tuple) -> str:
        """The input shapes and dtypes a recompile notice names."""
        return ", ".join(f"{list(s.shape)} {s.dtype}" for s in specs)

    def _trace(self, specs: tuple) -> Graph:
        try:
            return trace_function(self.traced_fn(), self.model, specs, name=self.kind,
                                  training=self.training)
        except ShapeError as e:
            doubles = [i for i, s in enumerate(specs) if s.dtype == "f64"]
            if not doubles or "dtypes differ" not in str(e):
                raise
            raise ShapeError(f"{e}; input {doubles[0]} is float64 (numpy's default): cast it "
                             "to the model's float32, x.astype(np.float32)") from None

    def _compile(self, specs: tuple) -> Entry:
        start = time.perf_counter()
        graph = self._trace(specs)
        labels = label_inputs(graph)
        if labels:  # checked natively where the backend can (cpu), else by check_inputs
            graph.attributes["ember.label_args"] = [list(label) for label in labels]
        if self.constant_params:
            graph.attributes["ember.constant_params"] = True
        pipeline = with_low_precision(self.pipeline(), graph,
                                      getattr(self.backend, "LEGALIZE_LOW_PRECISION", None))
        stages, run = self._lower(graph, pipeline)
        entry = Entry(stages.graph, run, stages, time.perf_counter() - start, specs, labels)
        self.compiles += 1
        dump = DUMP_IR.get()
        if dump is not None:
            stages.write(str(dump), prefix=self.kind)
        return entry

    def _lower(self, graph: Graph, pipeline: list[str]) -> tuple[Stages, object]:
        """The IR passes and the backend; a fused form the backend has no kernel for is
        compiled again unfused (one notice), never refused."""
        with stage_cache.collector_paused():  # ~0.1 s of a 16-layer step's cached load
            stages = stage_cache.stages(graph, pipeline, self.backend_name)
            try:
                with vouching(stages.graph, stages.digest):  # the backend need not verify it
                    return stages, self.backend.compile(stages.graph)
            except UnsupportedFusionError as e:
                unfused = without_fusion(pipeline, e.fuse_option)
                if unfused == pipeline:
                    raise
                print(f"ember: {self.kind}: {e}; compiling with fuse{{{e.fuse_option}=false}}",
                      file=sys.stderr)
        return self._lower(parse(stages.traced_text), unfused)  # the passes ran on `graph`

    # -- running ------------------------------------------------------------------------

    def check_inputs(self, entry: Entry, inputs: tuple) -> None:
        """Clear errors for what would otherwise fail deep inside, or silently."""
        check_labels(entry.labels, inputs)

    def arguments(self, entry: Entry, inputs: tuple) -> list:
        """The graph's arguments: the inputs, with the rng counter at `ember.rng`."""
        args = list(inputs)
        if entry.rng_index is not None:
            args.insert(entry.rng_index,
                        np.asarray(self.rng_step | self.rng_shard << 32, dtype=np.int64))
        return args

    def run(self, entry: Entry, args: list, params: dict, out: dict | None = None,
            **options) -> list:
        """Run the compiled graph; an error names the op and source line that raised it.
        `out`: {result position: array} to write results into (backends with `writes_out`);
        `options`: the backend's own (the cpu's `params_as_bound`)."""
        try:
            if out is not None:
                options["out"] = out
            return entry.run(args, params, **options)
        except Exception as e:
            self.explain(entry, args, params, e)
            raise

    def explain(self, entry: Entry, args: list, params: dict, error: Exception) -> None:
        """Raise what says why a run failed, where more can be said than `error` does: the
        rows or values behind a backend's own input check (`check_inputs` again), else
        the op and source line (debug.py)."""
        debug.explain(error, entry, args, params, self.kind,
                      lambda inputs: self.check_inputs(entry, inputs))

    def check_finite(self, entry: Entry, args: list, params: dict, outs: list) -> None:
        """Under detect_anomaly: any NaN/Inf in the results is traced to the op behind it
        (debug.py)."""
        debug.check_finite(outs, entry, args, params, f"{self.kind} at step {self.rng_step}",
                           self.backend_name)

    def extra_inputs(self, entry: Entry, table: dict) -> list:
        """Arguments after the inputs and the rng counter (a training step's lr, state)."""
        return []

    def params(self, table: dict) -> dict:
        """Param values for the backend: on a device backend, the device array the last
        step left, unless the Param was given another value since (then the host value)."""
        if not self.on_device:
            return param_values(table)
        return {pid: d if (d := p.device_value()) is not None else p.val()
                for pid, p in table.items()}

    def set_param(self, table: dict, pid: str, value) -> None:
        """Rebind a Param to a result: a device backend's stays on the device."""
        if self.on_device:
            table[pid].set_device_value(value, to_host)
        else:
            table[pid].set_value(value)

    def execute(self, inputs: tuple) -> tuple[Entry, dict, list[np.ndarray]]:
        """Compile if needed, check, run: (entry, the param table, the results)."""
        table = self.param_table()
        entry = self.entry(inputs, table)
        if not entry.native_checks:
            self.check_inputs(entry, inputs)
        params = self.params(table)
        args = self.arguments(entry, inputs) + self.extra_inputs(entry, table)
        outs = self.run(entry, args, params)
        if self.detect_anomaly:
            self.check_finite(entry, args, params, outs)
        return entry, table, outs


_type_shape_dtype = attrgetter("__class__", "shape", "dtype")  # what entry() reads per call


def _inputs_read(inputs: tuple) -> tuple | None:
    """What a call's key compares of its inputs, read in C: where two calls' agree, so do
    their keys' shapes and dtypes. None for an input without them (the key compares it)."""
    try:
        return tuple(map(_type_shape_dtype, inputs))
    except AttributeError:
        return None


def _shape_and_dtype(x) -> tuple:
    """What of an input keys a compiled graph (cheaper than a TensorSpec on every call)."""
    if type(x) is np.ndarray:
        return x.shape, x.dtype
    if isinstance(x, TensorSpec):  # keyed as an array of its dtype is, so calls find it
        return x.shape, numpy_dtype(x.dtype)
    dtype = getattr(x, "dtype", None)
    if not isinstance(dtype, np.dtype):  # a list, a scalar, a torch tensor (its own dtypes)
        dtype = np.asarray(x).dtype
    return np.shape(x), dtype


class CompiledFunction(Compiled):
    """`em.compile(model, *specs)`: the model's forward, numpy in, numpy out."""

    constant_params = True

    def __init__(self, model: Module, specs: tuple, backend: str = "cpu", linear: str = "split"):
        super().__init__(model, backend, linear)
        self.entry(specs)

    def run(self, entry: Entry, args: list, params: dict, out: dict | None = None) -> list:
        """`Compiled.run`, after telling a backend that keeps copies of the params (packed
        weights) that they may be stale: some Param was rebound since this graph last ran
        (`Edits.values` counts `set_value` and a training step's updates, made in place);
        where none was, the cpu binds the arrays it bound last call as they were (a
        MobileNet's 109 params took 70 of the 100 us a call spent in Python)."""
        if entry.values_seen != Edits.values:
            changed = getattr(entry.run, "params_changed", None)
            if changed is not None:
                changed()
            entry.values_seen = Edits.values
        elif getattr(entry.run, "takes_params_as_bound", False):  # (none rebound since)
            return super().run(entry, args, params, out, params_as_bound=True)
        return super().run(entry, args, params, out)

    def traced_fn(self):
        return self.model

    def pipeline(self):
        return inference_pipeline(self.linear, getattr(self.backend, "LAYOUT", None))

    @one_call_at_a_time
    def __call__(self, *inputs: np.ndarray):
        entry, _, outs = self.execute(inputs)
        outs = [to_host(o) for o in entry.split(outs)[0]]
        return outs[0] if len(outs) == 1 else tuple(outs)


__all__ = ["AnomalyError", "CompiledFunction", "Entry", "ExecutionError"]
