"""Symbolic dimensions: a handful of compiled graphs for every length, not one per length.

A symbolic dimension is named in a spec, `em.TensorSpec((16, "T"), "i64")`, or by
`dynamic_dims={input index: {axis: "T"}}` (for example arrays and for functions compiled
on first call; a training step's indices count all of a call's arguments, the model's
inputs and the loss function's alike: `{0: {1: "T"}, 1: {1: "T"}, 2: {1: "T"}}` for
`step(tokens, mask, targets)` with `n_inputs=2`). At each call every symbolic dimension's
size is read from the inputs (inputs sharing a name must agree), rounded up to its bucket
(a power of two, at least 8, unless `buckets=` lists the sizes) and the inputs are
zero-padded to it; the graph is keyed by the padded shapes, so lengths 33..64 share one.
The real sizes ride along as hidden `tensor<i64>` inputs, one per name, and the
`pad-mask` pass (passes/pad_mask.py) masks every op that would mix padded positions into
real ones; the results that carry a padded axis are cut back to the real size. Python
sees only the bucket's sizes while tracing, so each padded graph is traced twice, at the
bucket and at other sizes: what differs besides shapes (a value computed from `x.shape`)
is refused, and constants whose axes follow a size (`np.arange(x.shape[1])`) are marked
for the pass (`follow_sizes`).

Where padding cannot be exact, the length compiles as it is, with a one-line notice: a
size above the largest bucket (once per such size), or a bucket whose graph has an op the
pass cannot mask (from then on every length of that bucket compiles exactly).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..frontend.module import Module
from ..frontend.trace import TensorSpec
from ..ir import Graph, is_float
from ..passes.pad_mask import PadMaskError, refuse
from .compiled import Compiled, CompiledFunction, one_call_at_a_time
from .params import state_key
from .precision import Autocasting, check_precision
from .steps import GradFunction, TrainStep

SMALLEST_BUCKET = 8


def notice(message: str) -> None:
    """One line to stderr, as the runtime's recompile notices are."""
    print(f"ember: {message}", file=sys.stderr)


@dataclass(frozen=True)
class CallSizes:
    """One call's sizes: each name's real size and bucket (None: compile it exactly)."""

    sizes: dict[str, int]
    buckets: dict[str, int | None]
    padded: bool
    over: tuple[str, ...] = ()  # "T=300" for each size above the largest bucket

    def lengths(self) -> list:
        return [np.asarray(n, dtype=np.int64) for n in self.sizes.values()]


class DynamicDims:
    """Which input axes are symbolic, how their sizes are bucketed, and whether padding
    was refused for this function."""

    def __init__(self, dims: dict[int, dict[int, str]], buckets: Sequence[int] | None = None):
        for i, axes in dims.items():
            for axis, name in axes.items():
                if not isinstance(name, str) or not name:
                    raise TypeError(f"dynamic_dims: input {i} axis {axis} must be named by a "
                                    f"string, got {name!r}")
        if buckets is not None:
            buckets = tuple(int(b) for b in buckets)
            if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
                raise ValueError(f"buckets must be increasing positive sizes, got {buckets}")
        self.dims = {int(i): {int(a): n for a, n in axes.items()} for i, axes in dims.items()}
        self.bucket_sizes = buckets
        # the buckets pad-mask could not make exact, with the model state and settings
        # (flags, requires_grad, optimizer) that made them so: in eval mode a BatchNorm
        # masks that training's batch statistics cannot
        self.refused: set[tuple] = set()

    @classmethod
    def of(cls, specs: Sequence, dynamic_dims: dict | None,
           buckets: Sequence[int] | None) -> DynamicDims | None:
        """From the specs' named dimensions and `dynamic_dims`; None when there are none."""
        dims = {i: dict(s.symbols) for i, s in enumerate(specs)
                if isinstance(s, TensorSpec) and s.symbols}
        for i, axes in (dynamic_dims or {}).items():
            dims.setdefault(int(i), {}).update(axes)
        if not dims:
            if buckets is not None:
                raise ValueError("buckets= needs a symbolic dimension (a name in a TensorSpec "
                                 "or dynamic_dims=)")
            return None
        return cls(dims, buckets)

    def bucket(self, n: int) -> int | None:
        """The padded size of a dimension of size `n`; None above the largest bucket."""
        if self.bucket_sizes is None:
            return max(SMALLEST_BUCKET, 1 << (n - 1).bit_length())
        return next((b for b in self.bucket_sizes if b >= n), None)

    def plan(self, inputs: Sequence) -> CallSizes:
        """Each symbolic size of this call, checked to agree across inputs, and its bucket."""
        sizes: dict[str, int] = {}
        seen: dict[str, tuple[int, int]] = {}
        for i, axes in self.dims.items():
            if i >= len(inputs):
                raise ValueError(f"symbolic dims name input {i}, but the call has "
                                 f"{len(inputs)} inputs")
            shape = np.shape(inputs[i])
            for axis, name in axes.items():
                if not -len(shape) <= axis < len(shape):
                    raise ValueError(f"input {i} of shape {list(shape)} has no axis {axis} "
                                     f"(symbolic dim {name})")
                n = shape[axis]
                if name in sizes and sizes[name] != n:
                    j, _ = seen[name]
                    who = f"inputs {j} and {i}" if j != i else f"input {i} axes {seen[name][1]} "\
                        f"and {axis}"
                    raise ValueError(f"{who} disagree on symbolic dim {name}: "
                                     f"{sizes[name]} vs {n}")
                sizes[name], seen[name] = n, (i, axis)
        buckets = {name: self.bucket(n) if n else None for name, n in sizes.items()}
        over = [f"{name}={n}" for name, n in sizes.items() if n and buckets[name] is None]
        padded = all(buckets.values())
        return CallSizes(sizes, buckets, padded, tuple(over))

    def smallest(self, bucket: int) -> int:
        """The smallest size that pads up to `bucket`."""
        sizes = self.bucket_sizes
        if sizes is None:
            return 1 if bucket <= SMALLEST_BUCKET else bucket // 2 + 1
        i = sizes.index(bucket)
        return 1 if i == 0 else sizes[i - 1] + 1

    def resized(self, specs: Sequence[TensorSpec], sizes: dict[str, int]) -> tuple:
        """`specs` with each symbolic dimension of size `sizes[name]`."""
        out = list(specs)
        for i, axes in self.dims.items():
            shape = list(out[i].shape)
            for axis, name in axes.items():
                shape[axis] = sizes[name]
            out[i] = TensorSpec(tuple(shape), out[i].dtype)
        return tuple(out)

    def pad(self, plan: CallSizes, inputs: Sequence) -> tuple:
        """The inputs zero-padded to their buckets, then the lengths."""
        out = list(inputs)
        for i, axes in self.dims.items():
            x = np.asarray(out[i])
            widths = [(0, 0)] * x.ndim
            for axis, name in axes.items():
                widths[axis] = (0, plan.buckets[name] - x.shape[axis])
            out[i] = np.pad(x, widths) if any(w for _, w in widths) else x
        return (*out, *plan.lengths())


def follow_sizes(graph: Graph, other: Graph, sizes: dict[str, tuple[int, int]]) -> None:
    """Check what the masks cannot see, in `graph` traced again as `other` at other sizes
    (`sizes`: name -> (padded size, other size)): the ops must be the same, and so must
    their attributes but for shapes, and the constants where both have positions (an
    arange or a triangular mask agree; `x.sum(axis=1) / x.shape[1]` divides by the bucket
    and does not: refused). A constant axis that follows a size (`np.arange(x.shape[1])`)
    is marked `ember.padded = [[axis, name], ...]` for pad-mask to follow too."""
    ops, others = graph.ops, other.ops
    if [op.name for op in ops] != [op.name for op in others]:
        raise PadMaskError("pad-mask: the traced ops change with the size of a symbolic "
                           "dimension")
    names = {pair: name for name, pair in sizes.items()}
    for op, o in zip(ops, others):
        for key, v in op.attributes.items():
            w = o.attributes.get(key)
            if isinstance(v, np.ndarray):
                common = tuple(slice(0, min(n, m)) for n, m in zip(v.shape, w.shape))
                same = v.ndim == w.ndim and np.array_equal(v[common], w[common],
                                                           equal_nan=is_float(v.dtype))
            else:  # int lists are shapes (reshape, broadcast), which follow the sizes
                same = isinstance(v, list) or v == w
            if not same:
                raise refuse(op, f"its {key} follows the size of a symbolic dimension (a "
                                 "value computed from x.shape?), which padding would change")
        if op.name == "ember.constant":
            shapes = zip(op.result.type.shape, o.result.type.shape)
            marks = [[axis, names.get((n, m))] for axis, (n, m) in enumerate(shapes) if n != m]
            if any(name is None for _, name in marks):
                raise refuse(op, "its shape follows a symbolic size other than as an axis of "
                                 "that size")
            if marks:
                op.attributes["ember.padded"] = marks


def cut(x, axis: int, inner: int, bucket: int, n: int) -> np.ndarray:
    """`x` without the padded positions along `axis` (position i is real when
    (i // inner) % bucket < n)."""
    x = np.asarray(x)
    shape = x.shape
    outer = shape[axis] // (inner * bucket)
    y = x.reshape(shape[:axis] + (outer, bucket, inner) + shape[axis + 1:])
    y = y[(slice(None),) * (axis + 1) + (slice(0, n),)]
    return np.ascontiguousarray(y.reshape(shape[:axis] + (outer * n * inner,) + shape[axis + 1:]))


class Dynamic:
    """Mixed into a compiled function (before its class): pads each call's inputs, adds
    `pad-mask` to the pipeline, cuts the results back; falls back to exact compiles."""

    dynamic: DynamicDims
    _plan: CallSizes | None = None
    _arity: int | None = None  # how many inputs the caller passes

    @one_call_at_a_time
    def __call__(self, *inputs):
        self._arity = len(inputs)
        plan = self.dynamic.plan(inputs)
        if plan.padded and self.dynamic.refused and self._refusal(plan) in self.dynamic.refused:
            plan = replace(plan, padded=False)
        self._plan = plan
        if not plan.padded:
            return super().__call__(*inputs)
        try:
            out = super().__call__(*self.dynamic.pad(plan, inputs))
        except PadMaskError as e:
            self.dynamic.refused.add(self._refusal(plan))
            notice(f"{self.kind}: compiling each length of bucket "
                   f"{', '.join(f'{n}={b}' for n, b in plan.buckets.items())} exactly: {e}")
            return self(*inputs)
        return self.cut_results(out, plan)

    def _refusal(self, plan: CallSizes) -> tuple:
        """What a refused bucket is refused for: its sizes, the model state, the settings."""
        return (tuple(plan.buckets.values()), state_key(self.param_table()), self.key_extra())

    def cut_results(self, out, plan: CallSizes):
        """The results of a padded call cut back to the real sizes (a tuple's items by
        their result index; a loss or gradients are returned as they are)."""
        found = self._require().graph.attributes.get("ember.padded_results", ())
        if not found:
            return out
        single = not isinstance(out, tuple)
        outs = [out] if single else list(out)
        for i, axis, name, inner, bucket in found:
            if i < len(outs) and isinstance(outs[i], np.ndarray):
                outs[i] = cut(outs[i], axis, inner, bucket, plan.sizes[name])
        return outs[0] if single else tuple(outs)

    def shapes_text(self, specs: tuple) -> str:
        """The (padded) shapes of the caller's inputs, without the hidden lengths."""
        return super().shapes_text(specs[:self._arity])

    def check_new_inputs(self, inputs: tuple) -> None:
        """The checks of the caller's (padded) inputs, without the hidden lengths."""
        super().check_new_inputs(inputs[:self._arity])

    def profile(self, *inputs, **options):
        """`Compiled.profile` of the graph a call on `inputs` runs."""
        self._arity = len(inputs)
        self._plan = plan = self.dynamic.plan(inputs)
        return super().profile(*(self.dynamic.pad(plan, inputs) if plan.padded else inputs),
                               **options)

    def traced_fn(self):
        """The function to trace; a padded graph takes the lengths after its inputs."""
        fn = super().traced_fn()
        k = len(self._plan.sizes) if self._plan is not None and self._plan.padded else 0
        return fn if not k else (lambda *xs: fn(*xs[:-k]))

    def _trace(self, specs: tuple):
        plan = self._plan
        if plan is None or not plan.padded:
            if plan is not None and plan.over:
                notice(f"{self.kind}: {', '.join(plan.over)} is above the largest bucket "
                       f"{self.dynamic.bucket_sizes[-1]}: compiling for that exact size")
            return super()._trace(specs)
        other = {name: b - 1 - k if b - 1 - k > 0 else b + 1 + k
                 for k, (name, b) in enumerate(plan.buckets.items())}  # each its own
        # and near the bucket's smallest: a branch on a size (`if x.shape[1] > 12`) that goes
        # another way somewhere in the bucket goes another way at one of its ends
        low = {name: max(1, self.dynamic.smallest(b) - k)
               for k, (name, b) in enumerate(plan.buckets.items())}
        tried = [other]
        if any(low[n] not in (b, other[n]) for n, b in plan.buckets.items()) and \
                len({(b, low[n]) for n, b in plan.buckets.items()}) == len(low):
            tried.append(low)  # (unless sizes that would not tell the dims apart)
        try:
            graph = super()._trace(specs)
            agains = []
            for sizes in tried:  # (a loop: super() without arguments fails in a comprehension)
                agains.append(super()._trace(self.dynamic.resized(specs, sizes)))
        except Exception as e:  # noqa: BLE001  (the exact sizes may trace: they get a try)
            sizes = ", ".join(f"{n}={b} and {' and '.join(str(t[n]) for t in tried)}"
                              for n, b in plan.buckets.items())
            raise PadMaskError(f"pad-mask: the model does not trace at {sizes}: "
                               f"{type(e).__name__}: {e}") from None
        for again, t in zip(agains, tried):
            follow_sizes(graph, again, {n: (b, t[n]) for n, b in plan.buckets.items()})
        first = len(specs) - len(plan.sizes)
        for k, name in enumerate(plan.sizes):
            graph.args[first + k].name = f"len_{name}"
        graph.attributes["ember.padded_args"] = [
            [i, axis % len(specs[i].shape), name] for i, axes in self.dynamic.dims.items()
            for axis, name in axes.items()]
        graph.attributes["ember.length_args"] = [[name, first + k]
                                                 for k, name in enumerate(plan.sizes)]
        return graph

    def pipeline(self) -> list[str]:
        rest = super().pipeline()
        if self._plan is None or not self._plan.padded:
            return rest
        return ["pad-mask{grads=true}" if "autodiff" in rest else "pad-mask", *rest]


class DynamicFunction(Autocasting, Dynamic, CompiledFunction):
    """`em.compile` with symbolic dims: compiled on first call, one graph per bucket."""

    def __init__(self, model: Module, dynamic: DynamicDims, backend: str = "cpu",
                 linear: str = "split", precision: str = "32"):
        self.dynamic, self.precision = dynamic, check_precision(precision)
        Compiled.__init__(self, model, backend, linear)


class DynamicGradFunction(Dynamic, GradFunction):
    """`em.compile_grad` with `dynamic_dims`."""

    def __init__(self, model: Module, loss_fn: Callable, dynamic: DynamicDims, **options):
        self.dynamic = dynamic
        super().__init__(model, loss_fn, **options)


class DynamicTrainStep(Dynamic, TrainStep):
    """`em.compile_train_step` with `dynamic_dims`."""

    def __init__(self, model: Module, loss_fn: Callable, optimizer, dynamic: DynamicDims,
                 **options):
        self.dynamic = dynamic
        super().__init__(model, loss_fn, optimizer, **options)
