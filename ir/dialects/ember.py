"""The `ember` dialect: core tensor ops every backend implements (its convolutions and
pools are in ember_windows.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from ..opdef import (
    COUNT,
    DTYPE,
    OPS,
    SHAPE,
    InferenceError,
    OpDef,
    broadcast_shapes,
    declare,
    fmt_shape,
    normalize_axes,
    register,
    same_dtype,
)
from ..precision import rounded
from ..types import LOW_PRECISION, TensorType, Type, dtype_of

ELEMENTWISE = frozenset({"pure", "elementwise", "memory_bound"})
MOVEMENT = frozenset({"pure", "memory_bound", "movement"})


@register
class Param(OpDef):
    """A model parameter, lazily materialized by the runtime (`id`, `path`, `init`, ...)."""

    name = "ember.param"
    attrs = {"id": str, "path": str}
    optional_attrs = {"init": str, "kind": str, "requires_grad": bool}


@register
class Constant(OpDef):
    """`constant {value = dense<...>}`: the value's dtype is the result's (bf16 values are
    ml_dtypes' bfloat16)."""

    name = "ember.constant"
    traits = frozenset({"pure", "memory_bound", "constant"})
    attrs = {"value": np.ndarray}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        v = attrs["value"]
        try:
            return [TensorType(v.shape, dtype_of(v.dtype))]
        except TypeError as e:
            raise InferenceError(f"ember.constant: {e}") from None


class Scalars:
    """What an `expand` writes one element in: `k.exp(x)`, `k.cmp(x, y, predicate="gt")`,
    `k.const(0.5)`. The backend lowering the expansion passes one that emits its own code
    (LLVM IR, C) for each op, in the dtype of the expanded op's operands."""

    def __init__(self, emit: Callable[[str, dict[str, Any], list[Any]], Any],
                 const: Callable[[Any], Any]):
        self.emit, self.const = emit, const

    def __getattr__(self, op: str) -> Callable[..., Any]:
        return lambda *args, **attrs: self.emit(op, attrs, list(args))


class Elementwise(OpDef):
    """An op on elements, declared once with everything about it: the result has the
    operands' broadcast shape and the dtype `dtype` gives; `ref(attrs, *arrays)` is its numpy
    meaning (the interpreter, constant folding); `kernel.<name>`, its twin in fused bodies,
    is derived from it (ir/dialects/kernel.py), and so is its place in each backend's op set.
    A backend lowers the op by name or, where `expand` is set, as that composition of other
    elementwise ops, `expand(k: Scalars, attrs, *operands)`: then it needs no code at all."""

    traits = ELEMENTWISE
    ref: ClassVar[Callable[..., np.ndarray]]
    expand: ClassVar[Callable[..., Any] | None] = None

    @classmethod
    def dtype(cls, types: Sequence[Type], attrs: dict[str, Any]) -> str:
        """The result's dtype; InferenceError where the operands do not fit the op."""
        return same_dtype(cls.name, types)

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        dtype = cls.dtype(operand_types, attrs)
        return [TensorType(broadcast_shapes(cls.name, *(t.shape for t in operand_types)), dtype)]


class Unary(Elementwise):
    arity = (1, 1)
    float_only = True

    @classmethod
    def dtype(cls, types: Sequence[Type], attrs: dict[str, Any]) -> str:
        (t,) = types
        if cls.float_only and not t.is_float:
            what = "a float tensor" if isinstance(t, TensorType) else "a float"
            raise InferenceError(f"{cls.name} needs {what}, got {t}")
        return t.dtype


class Binary(Elementwise):
    arity = (2, 2)


def elementwise(base: type[Elementwise], name: str, ref: Callable[..., np.ndarray],
                **extra: Any) -> None:
    """Declare `ember.<name>`, a `base` whose meaning is numpy's `ref(*arrays)`."""
    register(type(name.title(), (base,), {"name": f"ember.{name}", **extra,
                                          "ref": staticmethod(lambda a, *xs: ref(*xs))}))


erf = np.vectorize(math.erf, otypes=[np.float64])  # numpy has none

elementwise(Binary, "add", np.add)
elementwise(Binary, "sub", np.subtract)
elementwise(Binary, "mul", np.multiply)
elementwise(Binary, "div", np.divide)
elementwise(Binary, "max", np.maximum)
elementwise(Binary, "min", np.minimum)
elementwise(Binary, "pow", np.power)
elementwise(Unary, "exp", np.exp)
elementwise(Unary, "log", np.log)
elementwise(Unary, "sqrt", np.sqrt)
elementwise(Unary, "rsqrt", lambda x: 1 / np.sqrt(x))
elementwise(Unary, "tanh", np.tanh)
elementwise(Unary, "sigmoid", lambda x: 1 / (1 + np.exp(-x)))
elementwise(Unary, "erf", erf)
elementwise(Unary, "neg", np.negative, float_only=False)
elementwise(Unary, "relu", lambda x: np.maximum(x, 0), float_only=False)
elementwise(Unary, "abs", np.abs, float_only=False)


def softplus_params(attrs: dict[str, Any]) -> tuple[float, float]:
    """(beta, threshold) of an `ember.softplus`: PyTorch's defaults, 1 and 20, if not given."""
    return attrs.get("beta", 1.0), attrs.get("threshold", 20.0)


@register
class Softplus(Unary):
    """`softplus(x) {beta, threshold}`: log(1 + exp(beta x)) / beta, and x itself where
    beta x > threshold, as PyTorch's (the attributes are optional; see `softplus_params`)."""

    name = "ember.softplus"
    optional_attrs = {"beta": float, "threshold": float}

    @staticmethod
    def ref(a: dict[str, Any], x: np.ndarray) -> np.ndarray:
        beta, threshold = softplus_params(a)
        t = x * beta
        return np.where(t > threshold, x, np.logaddexp(0, t) / beta)

    @staticmethod
    def expand(k: Scalars, a: dict[str, Any], x: Any) -> Any:
        """log(1 + exp(t)) as max(t, 0) + log1p(exp(-|t|)), which never overflows, with
        log1p(u) = u log(w) / (w - 1), w = 1 + u (u where w rounds to 1): Goldberg's
        accurate log1p, from log alone."""
        beta, threshold = softplus_params(a)
        t = k.mul(x, k.const(beta))
        u = k.exp(k.neg(k.abs(t)))
        w = k.add(u, k.const(1))
        log1p = k.select(k.cmp(w, k.const(1), predicate="eq"), u,
                         k.div(k.mul(u, k.log(w)), k.sub(w, k.const(1))))
        y = k.div(k.add(k.max(t, k.const(0)), log1p), k.const(beta))
        return k.select(k.cmp(t, k.const(threshold), predicate="gt"), x, y)


@register
class Sign(Unary):
    """`sign(x)`: -1, 0 or 1 by the sign of x, in x's dtype (a bool is itself); 0 for -0.0,
    NaN for NaN, as numpy's and onnxruntime's (torch.sign gives 0 for NaN). A primitive,
    not a select chain in the frontend: its gradient is 0 everywhere (autodiff/rules.py),
    which a chain that passes NaN through as x would not have, and ONNX's Sign is one op."""

    name = "ember.sign"
    float_only = False

    @staticmethod
    def ref(a: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return x if x.dtype == np.bool_ else np.sign(x)

    @staticmethod
    def expand(k: Scalars, a: dict[str, Any], x: Any) -> Any:
        zero = k.const(0)
        rest = k.select(k.cmp(x, zero, predicate="eq"), zero, x)  # +-0 -> 0; NaN stays
        return k.select(k.cmp(x, zero, predicate="gt"), k.const(1),
                        k.select(k.cmp(x, zero, predicate="lt"), k.const(-1), rest))


CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
       "gt": np.greater, "ge": np.greater_equal}  # predicate -> numpy


@register
class Cmp(Elementwise):
    name = "ember.cmp"
    arity = (2, 2)
    attrs = {"predicate": str}
    ref = staticmethod(lambda a, x, y: CMP[a["predicate"]](x, y))

    @classmethod
    def dtype(cls, types: Sequence[Type], attrs: dict[str, Any]) -> str:
        if attrs["predicate"] not in CMP:
            raise InferenceError(f"{cls.name} predicate {attrs['predicate']!r} is not one of "
                                 f"{', '.join(CMP)}")
        same_dtype(cls.name, types)
        return "i1"


@register
class Select(Elementwise):
    """`select(cond, a, b)`: a where cond else b, all three broadcast."""

    name = "ember.select"
    arity = (3, 3)

    @staticmethod
    def ref(a: dict[str, Any], c: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.where(c, x, y)

    @classmethod
    def dtype(cls, types: Sequence[Type], attrs: dict[str, Any]) -> str:
        c, a, b = types
        if c.dtype != "i1":
            raise InferenceError(f"{cls.name} condition must be i1, got {c}")
        return same_dtype(cls.name, [a, b])


@register
class Cast(Elementwise):
    name = "ember.cast"
    arity = (1, 1)
    attrs = {"dtype": DTYPE}
    ref = staticmethod(lambda a, x: rounded(x, a["dtype"]))  # to bf16/f16 through f32, as torch

    @classmethod
    def dtype(cls, types: Sequence[Type], attrs: dict[str, Any]) -> str:
        dtype: str = attrs["dtype"]
        return dtype


def expand(name: str, attrs: dict[str, Any], args: list[Any],
           emit: Callable[[str, dict[str, Any], list[Any]], Any], const: Callable[[Any], Any]
           ) -> Any:
    """Elementwise op `name` (any dialect prefix) as its declared composition, built by a
    backend's own `emit(op, attrs, args)` and `const(value)`; None for an op without one,
    which the backend lowers itself."""
    fn = getattr(OPS.get("ember." + name.split(".", 1)[-1]), "expand", None)
    return None if fn is None else fn(Scalars(emit, const), attrs, *args)


class Reduce(OpDef):
    traits = frozenset({"pure", "reduction", "memory_bound"})
    arity = (1, 1)
    attrs = {"axes": list, "keepdims": bool}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (t,) = operand_types
        axes = normalize_axes(cls.name, attrs["axes"], t.rank)
        if attrs["keepdims"]:
            shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape))
        else:
            shape = tuple(d for i, d in enumerate(t.shape) if i not in axes)
        return [t.with_shape(shape)]


declare("ember", Reduce, "reduce_sum reduce_mean reduce_max")


@register
class Broadcast(OpDef):
    """numpy `broadcast_to(x, shape)`."""

    name = "ember.broadcast"
    traits = MOVEMENT
    arity = (1, 1)
    attrs = {"shape": SHAPE}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (t,) = operand_types
        shape = tuple(attrs["shape"])
        if len(shape) < t.rank or broadcast_shapes(cls.name, t.shape, shape) != shape:
            raise InferenceError(f"ember.broadcast: {fmt_shape(t.shape)} does not broadcast "
                                 f"to {fmt_shape(shape)}")
        return [t.with_shape(shape)]


@register
class Reshape(OpDef):
    name = "ember.reshape"
    traits = MOVEMENT
    arity = (1, 1)
    attrs = {"shape": SHAPE}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (t,) = operand_types
        shape = tuple(attrs["shape"])
        if math.prod(shape) != t.size:
            raise InferenceError(f"ember.reshape: cannot reshape {fmt_shape(t.shape)} "
                                 f"to {fmt_shape(shape)}")
        return [t.with_shape(shape)]


@register
class Transpose(OpDef):
    name = "ember.transpose"
    traits = MOVEMENT
    arity = (1, 1)
    attrs = {"perm": list}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (t,) = operand_types
        perm = attrs["perm"]
        if sorted(perm) != list(range(t.rank)):
            raise InferenceError(f"ember.transpose: perm {perm} is not a permutation of "
                                 f"rank {t.rank}")
        return [t.with_shape(tuple(t.shape[p] for p in perm))]


def _window(op: str, full: tuple[int, ...], start: list[int], step: list[int],
            part: tuple[int, ...]) -> None:
    """That `part` is the elements start + i * step of `full`, per dim (slice, unslice)."""
    if not len(start) == len(step) == len(full) == len(part):
        raise InferenceError(f"{op}: start {start} and step {step} need one entry per dim of "
                             f"{fmt_shape(full)}")
    for d, (n, a, s, m) in enumerate(zip(full, start, step, part)):
        if s < 1 or a < 0 or (m and a + s * (m - 1) >= n) or a > n:
            raise InferenceError(f"{op}: dim {d} of {fmt_shape(full)} has no {m} elements "
                                 f"from {a} by {s}")


class _Windowed(OpDef):
    """slice and unslice: one window of a `full` shape, `part` elements from `start` by
    `step`; slice's operand is the full tensor, unslice's result is."""

    traits = MOVEMENT
    arity = (1, 1)
    attrs = {"start": list, "step": list, "shape": SHAPE}
    reads: ClassVar[bool]

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (t,) = operand_types
        shape = tuple(attrs["shape"])
        full, part = (t.shape, shape) if cls.reads else (shape, t.shape)
        _window(cls.name, full, attrs["start"], attrs["step"], part)
        return [t.with_shape(shape)]


@register
class Slice(_Windowed):
    """`slice(x) {start, step, shape}`: x[start_d : : step_d], `shape[d]` elements per dim
    (torch's basic indexing; steps are >= 1, as torch's)."""

    name = "ember.slice"
    reads = True


@register
class Unslice(_Windowed):
    """`unslice(x) {start, step, shape}`: zeros of `shape` with x at the elements that
    `slice` with the same attributes reads; the transpose of slice (its gradient)."""

    name = "ember.unslice"
    reads = False


@register
class Concat(OpDef):
    """`concat(x0, x1, ...) {axis}`: the operands joined along `axis` (torch.cat); every
    other dim and the dtype agree."""

    name = "ember.concat"
    traits = MOVEMENT
    arity = (1, None)
    attrs = {"axis": int}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        first = operand_types[0]
        dtype = same_dtype(cls.name, operand_types)
        (axis,) = normalize_axes(cls.name, [attrs["axis"]], first.rank)
        rest = [t.shape[:axis] + t.shape[axis + 1:] for t in operand_types]
        if any(t.rank != first.rank for t in operand_types) or len(set(rest)) > 1:
            raise InferenceError(f"{cls.name}: shapes "
                                 f"{', '.join(fmt_shape(t.shape) for t in operand_types)} differ "
                                 f"outside axis {axis}")
        shape = list(first.shape)
        shape[axis] = sum(t.shape[axis] for t in operand_types)
        return [TensorType(tuple(shape), dtype)]


@register
class Matmul(OpDef):
    """numpy matmul on operands of rank >= 2; batch dimensions broadcast. `dtype = "f32"`
    on bf16/f16 operands: the products' f32 sums are the result, not rounded (a backend's
    low-precision GEMM, passes/low_precision_gemm.py)."""

    name = "ember.matmul"
    traits = frozenset({"pure", "compute_bound"})
    arity = (2, 2)
    optional_attrs = {"dtype": DTYPE}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        a, b = operand_types
        dtype = same_dtype(cls.name, operand_types)
        if attrs.get("dtype", dtype) != dtype:
            if dtype not in LOW_PRECISION or attrs["dtype"] != "f32":
                raise InferenceError(f"ember.matmul: dtype {attrs['dtype']} on {dtype} operands "
                                     "(only bf16 or f16 operands may give f32)")
            dtype = "f32"
        if a.rank < 2 or b.rank < 2 or a.shape[-1] != b.shape[-2]:
            raise InferenceError(f"ember.matmul: shapes {fmt_shape(a.shape)} and "
                                 f"{fmt_shape(b.shape)} do not multiply")
        batch = broadcast_shapes(cls.name, a.shape[:-2], b.shape[:-2])
        return [TensorType(batch + (a.shape[-2], b.shape[-1]), dtype)]


@register
class OneHot(OpDef):
    """`one_hot(labels)`: [..., num_classes] of `dtype`, 1 where index == label."""

    name = "ember.one_hot"
    traits = frozenset({"pure", "memory_bound"})
    arity = (1, 1)
    attrs = {"num_classes": COUNT, "dtype": DTYPE}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (t,) = operand_types
        if t.dtype not in ("i64", "i32"):
            raise InferenceError(f"ember.one_hot needs integer labels, got {t}")
        return [TensorType(t.shape + (attrs["num_classes"],), attrs["dtype"])]


def _float(op: str, t: TensorType) -> None:
    if not t.is_float:
        raise InferenceError(f"{op} needs a float tensor, got {t}")


@register
class AllReduce(OpDef):
    """`allreduce(x)`: the sum of x over the ranks of a data-parallel run (x itself in one
    process), which SyncBatchNorm's statistics need inside the step. Not pure: it is never
    merged, removed or recomputed, so every rank makes the same calls in the same order.
    Its gradient is the allreduce of the gradient."""

    name = "ember.allreduce"
    traits = frozenset({"collective", "memory_bound"})
    arity = (1, 1)

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        (x,) = operand_types
        _float(cls.name, x)
        return [x]


@register
class GradsReady(OpDef):
    """`grads_ready(g, ...) {bucket}`: these gradients are final, so a data-parallel step
    may start reducing bucket `bucket` of its flat buffer while the backward goes on
    (passes/bucket_grads.py, runtime/data_parallel.py). Its result is the bucket's index,
    a token nothing reads. Not pure: never removed, merged, moved or recomputed."""

    name = "ember.grads_ready"
    traits = frozenset({"collective"})
    arity = (1, None)
    attrs = {"bucket": COUNT}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        return [TensorType((), "i64")]


@register
class Dropout(OpDef):
    """`dropout(x, rng) {p, seed, key}`: x * keep / (1 - p), keep drawn by the counter hash.

    `rng` is a `tensor<i64>` scalar (the step counter, a graph argument); the mask depends
    only on (seed, key, step, flat index), so every backend draws the same one (reference:
    `backends/interpreter/rng.py`). Its gradient is the same op applied to the gradient.
    """

    name = "ember.dropout"
    traits = frozenset({"pure", "random", "memory_bound"})
    arity = (2, 2)
    attrs = {"p": float, "seed": int, "key": int}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        x, rng = operand_types
        _float(cls.name, x)
        if rng.shape != () or rng.dtype != "i64":
            raise InferenceError(f"ember.dropout: rng must be a tensor<i64> scalar, got {rng}")
        if not 0.0 <= attrs["p"] < 1.0:
            raise InferenceError(f"ember.dropout: p must be in [0, 1), got {attrs['p']}")
        return [x]


@register
class Gather(OpDef):
    """`gather(table, indices) {axis = 0}`: table[indices] (indices.shape + table.shape[1:])."""

    name = "ember.gather"
    arity = (2, 2)
    optional_attrs = {"axis": int}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        table, idx = operand_types
        if attrs.get("axis", 0) != 0:
            raise InferenceError(f"ember.gather: only axis 0 is supported, got {attrs['axis']}")
        if idx.dtype not in ("i64", "i32"):
            raise InferenceError(f"ember.gather needs integer indices, got {idx}")
        if table.rank < 1:
            raise InferenceError(f"ember.gather: table must have rank >= 1, got {table}")
        return [table.with_shape(idx.shape + table.shape[1:])]


@register
class ScatterAdd(OpDef):
    """`scatter_add(indices, updates) {shape}`: zeros(shape), then updates added at indices."""

    name = "ember.scatter_add"
    arity = (2, 2)
    attrs = {"shape": SHAPE}

    @classmethod
    def infer(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[Type]:
        idx, upd = operand_types
        shape = tuple(attrs["shape"])
        if idx.dtype not in ("i64", "i32"):
            raise InferenceError(f"ember.scatter_add needs integer indices, got {idx}")
        if not shape or upd.shape != idx.shape + shape[1:]:
            raise InferenceError(f"ember.scatter_add: updates {fmt_shape(upd.shape)} do not fit "
                                 f"indices {fmt_shape(idx.shape)} into {fmt_shape(shape)} (want "
                                 "indices.shape + shape[1:])")
        return [upd.with_shape(shape)]
