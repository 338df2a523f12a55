"""Tracing: run a model's forward on symbolic Tensors and record an `ir.Graph`.

`trace(model, *specs)` records `forward`; `trace_function(fn, model, specs)` records any
function of tensors that may call the model (the runtime traces `loss_fn(model(x), y)`).
Params become `ember.param` ops (once per trace, by id) without being materialized;
flags are read as python bools. Each op carries the location of the user's source line,
and a type error while building an op becomes a `ShapeError` naming the module path.

A trace is a training trace or not (`training=`): Dropout is active and BatchNorm uses
batch statistics only in a training trace whose module flag is on. Graph roles it records:
- `ember.rng = <arg index>`: the `tensor<i64>` argument `rng` (the step counter), added
  on the first random op;
- `ember.buffer_updates = [param ids]`: buffers given new values by `update_buffer` (a
  training trace only), whose new values are the graph's last results, in this order.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from .. import ir
from . import context
from .module import Module
from .param import Param, ParamId, random_seed
from .tensor import Tensor

_PACKAGE = __name__.split(".")[0]  # "ember": frames of this package are not user code
_ENTRY = _PACKAGE + ".__main__"  # the command line: frames outside it are its launcher's


class ShapeError(ValueError):
    """An op's operands do not fit, e.g. `layers.0 (Linear): nn.linear: input [32, 20] ...`."""


@dataclass(frozen=True)
class TensorSpec:
    """The shape and dtype of a traced input: `TensorSpec((32, 64), "f32")`.

    A dimension may be a name instead of a size, `TensorSpec((16, "T"), "i64")`: a symbolic
    dimension, which `em.compile` pads to a bucket at each call (runtime/dynamic.py); inputs
    that share a name must agree on its size. Tracing needs every size (`type` refuses).
    """

    shape: tuple[int | str, ...]
    dtype: str = "f32"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(d if isinstance(d, str) else int(d)
                                                for d in self.shape))
        if self.dtype not in ir.DTYPES:
            object.__setattr__(self, "dtype", ir.dtype_of(self.dtype))

    @classmethod
    def of(cls, x) -> TensorSpec:
        """The spec of a TensorSpec, an ir.TensorType or an example array."""
        if isinstance(x, TensorSpec):
            return x
        if isinstance(x, ir.TensorType):
            return cls(x.shape, x.dtype)
        x = np.asarray(x)
        return cls(x.shape, ir.dtype_of(x.dtype))

    @property
    def symbols(self) -> dict[int, str]:
        """{axis: name} of the symbolic dimensions."""
        return {a: d for a, d in enumerate(self.shape) if isinstance(d, str)}

    @property
    def type(self) -> ir.TensorType:
        if self.symbols:
            raise ValueError(f"TensorSpec{self.shape}: symbolic dimensions "
                             f"{', '.join(self.symbols.values())} have no size to trace with; "
                             "em.compile pads them per call, em.trace needs sizes")
        return ir.TensorType(self.shape, self.dtype)


_MODEL_SOURCE: ContextVar[ir.Location | None] = ContextVar("ember_model_source", default=None)


@contextmanager
def model_source(loc: ir.Location | None):
    """Within the block, an op no user frame made gets `loc`, the model's own source (the
    `ember` command sets it: its launcher script is no user code), or, nearer, the line
    of loc's file on the stack (a built-in model's line in ember)."""
    token = _MODEL_SOURCE.set(loc)
    try:
        yield
    finally:
        _MODEL_SOURCE.reset(token)


def _module_name(f) -> str:
    """The module of frame `f`: `python -m ember` runs ember's `__main__` as `__main__`."""
    spec = f.f_globals.get("__spec__")
    return getattr(spec, "name", None) or f.f_globals.get("__name__", "")


def user_location() -> ir.Location | None:
    """The innermost stack frame outside ember: the user's line that made this op.

    Frames outside ember's command line (`ember.__main__`: the `ember` launcher script,
    runpy, a test calling `main`) are never the user's; where the walk reaches it first,
    the op gets the `model_source` location (or None).
    """
    source = _MODEL_SOURCE.get()
    nearest = None  # the innermost frame in the model's source file
    f = sys._getframe(1)
    while f is not None:
        name = _module_name(f)
        if name == _ENTRY:
            break
        if name != _PACKAGE and not name.startswith(_PACKAGE + "."):
            return ir.Location(f.f_code.co_filename, f.f_lineno, 0)
        if nearest is None and source is not None and f.f_code.co_filename == source.file:
            nearest = ir.Location(source.file, f.f_lineno, 0)
        f = f.f_back
    return nearest or source


class Trace:
    """The graph being recorded: builds ops, lifts operands, maps params and module paths."""

    def __init__(self, graph: ir.Graph, model: Module | None, training: bool = False):
        self.graph = graph
        self.training = bool(training)
        self.seed = random_seed()  # the `seed` of this trace's random ops
        self.keys = 0  # random ops so far: each gets its own `key`
        self._rng: Tensor | None = None
        self.buffer_updates: dict[ParamId, tuple[Param, Tensor]] = {}
        self.builder = ir.Builder(graph.body)
        self.scopes: list[Module] = []
        self.module_paths: dict[int, str] = {}
        self.param_paths: dict[ParamId, str] = {}
        if model is not None:
            self.module_paths = {id(m): path for path, m in reversed(model.named_modules())}
            for path, p in reversed(model.all_params()):
                self.param_paths[p.id] = path  # the first path of a shared param wins
        self.param_tensors: dict[ParamId, Tensor] = {}

    @contextmanager
    def scope(self, module: Module):
        self.scopes.append(module)
        try:
            yield
        finally:
            self.scopes.pop()

    def where(self) -> str:
        """The module being called, as `path (Class)`, for error messages."""
        if not self.scopes:
            return f"<{self.graph.name}>"
        m = self.scopes[-1]
        path = self.module_paths.get(id(m))
        return f"{path or ('<root>' if path == '' else '<not in model>')} ({type(m).__name__})"

    def error(self, message: str) -> ShapeError:
        loc = user_location()
        at = f" (at {loc.file}:{loc.line})" if loc else ""
        return ShapeError(f"{self.where()}: {message}{at}")

    def op(self, name: str, *operands: Tensor, **attrs) -> Tensor:
        (out,) = self.ops(name, *operands, **attrs)
        return out

    def ops(self, name: str, *operands: Tensor, **attrs) -> tuple[Tensor, ...]:
        """Emit `name` and return all of its results (`nn.batch_norm` has three)."""
        try:
            op = self.builder.create(name, [t.value for t in operands], attrs,
                                     loc=user_location())
        except ir.InferenceError as e:
            raise self.error(str(e)) from None
        return tuple(Tensor(r, self) for r in op.results)

    def rng(self) -> Tensor:
        """The step counter (`tensor<i64>` argument `rng`), added on first use."""
        if self._rng is None:
            arg = self.graph.body.add_arg(ir.TensorType((), "i64"), "rng")
            self.graph.attributes["ember.rng"] = arg.index
            self._rng = Tensor(arg, self)
        return self._rng

    def next_key(self) -> int:
        """A new `key` for a random op: masks of different ops differ."""
        self.keys += 1
        return self.keys - 1

    def update_buffer(self, param: Param, value) -> None:
        """Give buffer `param` a new value after this step (recorded in training traces only).

        The last update of a buffer wins; the runtime writes it back after each step.
        """
        if param.kind != "buffer":
            raise TypeError(f"{self.where()}: update_buffer needs a buffer Param, got a "
                            f"{param.kind} Param")
        value = self.lift(value)
        if value.shape != param.shape or value.dtype != param.dtype:
            raise self.error(f"update_buffer: new value {value.type} does not match buffer "
                             f"{ir.TensorType(param.shape, param.dtype)}")
        self.param_tensor(param)  # the buffer must be in the model
        if self.training:
            self.buffer_updates.pop(param.id, None)
            self.buffer_updates[param.id] = (param, value)

    def param_tensor(self, p: Param) -> Tensor:
        """The `ember.param` op of `p`, created before the graph's other ops on first use."""
        if p.id in self.param_tensors:
            return self.param_tensors[p.id]
        if p.id not in self.param_paths:
            raise ValueError(f"{self.where()}: {p!r} is used while tracing but is not in the "
                             "model; assign it to a module field")
        attrs = {"id": str(p.id), "path": self.param_paths[p.id]}
        if p.init is not None:
            attrs["init"] = str(p.init)
        if p.kind in ("buffer", "flag"):
            attrs["kind"] = p.kind
        if not p.requires_grad:
            attrs["requires_grad"] = False
        op = ir.Operation("ember.param", [], [ir.TensorType(p.shape, p.dtype)], attrs,
                          loc=user_location())
        self.graph.body.insert(len(self.param_tensors), op)
        self.param_tensors[p.id] = t = Tensor(op.result, self)
        return t

    def constant(self, value: np.ndarray) -> Tensor:
        """An `ember.constant` of a copy of `value` (later changes to it do not leak in)."""
        return self.op("ember.constant", value=np.array(value, order="C"))

    def lift(self, x, dtype: str | None = None) -> Tensor:
        """A Tensor of this trace from a Tensor, a Param, a python scalar (of `dtype`) or array."""
        if isinstance(x, Tensor):
            if x.trace is not self:
                raise ValueError("a Tensor of another trace is used here")
            return x
        if isinstance(x, Param):
            return self.param_tensor(x)
        if isinstance(x, (bool, int, float)) and dtype is not None:
            if isinstance(x, float) and not ir.TensorType((), dtype).is_float and x != int(x):
                raise self.error(f"the scalar {x} does not fit a {dtype} tensor")
            return self.constant(np.array(x, dtype=ir.numpy_dtype(dtype)))
        if isinstance(x, (np.ndarray, np.generic, bool, int, float, list)):
            return self.constant(np.asarray(x))
        raise TypeError(f"cannot use a {type(x).__name__} as a tensor")


def trace_function(fn: Callable, model: Module | None, specs: Sequence, name: str = "forward",
                   arg_names: Sequence[str] | None = None, training: bool = False) -> ir.Graph:
    """Record `fn(*tensors)` as a graph; `model`'s params (any kind) may be used in it.

    `specs`: TensorSpecs, ir.TensorTypes or example arrays. Arguments are named `x`, `x1`,
    ... unless `arg_names` are given. `fn` returns a Tensor (or Param) or a tuple of them.
    `training`: a training trace (train and grad steps), see the module docstring; the
    graph's results are fn's outputs followed by the buffer updates.
    """
    types = [TensorSpec.of(s).type for s in specs]
    names = list(arg_names or ["x"] + [f"x{i}" for i in range(1, len(types))])
    graph = ir.Graph(name, types, names)
    t = Trace(graph, model, training)
    token = context.enter(t)
    try:
        out = fn(*(Tensor(a, t) for a in graph.args))
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        for o in outs:
            if not isinstance(o, (Tensor, Param)):
                raise TypeError(f"@{name} returned a {type(o).__name__}; expected Tensors")
        values = [t.lift(o).value for o in outs]
    finally:
        context.leave(token)
    if t.buffer_updates:
        graph.attributes["ember.buffer_updates"] = [str(pid) for pid in t.buffer_updates]
        values += [v.value for _, v in t.buffer_updates.values()]
    t.builder.create("func.return", values)
    return ir.verify(graph)


def trace(model: Module, *specs, training: bool = False) -> ir.Graph:
    """Record `model.forward` on inputs of these specs as the graph `@forward`."""
    return trace_function(model, model, specs, name="forward", training=training)
