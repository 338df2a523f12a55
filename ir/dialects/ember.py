"""The `ember` dialect: core tensor ops every backend implements."""

from __future__ import annotations

import numpy as np

from ..opdef import (
    InferenceError,
    OpDef,
    broadcast_shapes,
    fmt_shape,
    normalize_axes,
    register,
    same_dtype,
)
from ..types import DTYPES, TensorType, dtype_of

ELEMENTWISE = frozenset({"pure", "elementwise", "memory_bound"})


@register
class Param(OpDef):
    """A model parameter, lazily materialized by the runtime (`id`, `path`, `init`, ...)."""

    name = "ember.param"
    attrs = {"id": str, "path": str}
    optional_attrs = {"init": str, "kind": str, "requires_grad": bool}


@register
class Constant(OpDef):
    name = "ember.constant"
    traits = frozenset({"pure", "memory_bound", "constant"})
    attrs = {"value": np.ndarray}

    @classmethod
    def infer(cls, operand_types, attrs):
        v = attrs["value"]
        return [TensorType(v.shape, attrs.get("dtype") or dtype_of(v.dtype))]


class Unary(OpDef):
    traits = ELEMENTWISE
    arity = (1, 1)
    float_only = True

    @classmethod
    def infer(cls, operand_types, attrs):
        (t,) = operand_types
        if cls.float_only and not t.is_float:
            raise InferenceError(f"{cls.name} needs a float tensor, got {t}")
        return [t]


class Binary(OpDef):
    traits = ELEMENTWISE
    arity = (2, 2)

    @classmethod
    def infer(cls, operand_types, attrs):
        a, b = operand_types
        dtype = same_dtype(cls.name, operand_types)
        return [TensorType(broadcast_shapes(cls.name, a.shape, b.shape), dtype)]


def _declare(base: type[OpDef], names: str, **extra) -> None:
    for n in names.split():
        register(type(n.title(), (base,), {"name": f"ember.{n}", **extra}))


_declare(Binary, "add sub mul div max min pow")
_declare(Unary, "exp log sqrt rsqrt tanh sigmoid")
_declare(Unary, "neg relu abs", float_only=False)

CMP_PREDICATES = ("eq", "ne", "lt", "le", "gt", "ge")


@register
class Cmp(OpDef):
    name = "ember.cmp"
    traits = ELEMENTWISE
    arity = (2, 2)
    attrs = {"predicate": str}

    @classmethod
    def infer(cls, operand_types, attrs):
        if attrs["predicate"] not in CMP_PREDICATES:
            raise InferenceError(f"ember.cmp predicate {attrs['predicate']!r} is not one of "
                                 f"{', '.join(CMP_PREDICATES)}")
        a, b = operand_types
        same_dtype(cls.name, operand_types)
        return [TensorType(broadcast_shapes(cls.name, a.shape, b.shape), "i1")]


@register
class Select(OpDef):
    """`select(cond, a, b)`: a where cond else b, all three broadcast."""

    name = "ember.select"
    traits = ELEMENTWISE
    arity = (3, 3)

    @classmethod
    def infer(cls, operand_types, attrs):
        c, a, b = operand_types
        if c.dtype != "i1":
            raise InferenceError(f"ember.select condition must be i1, got {c}")
        dtype = same_dtype(cls.name, [a, b])
        return [TensorType(broadcast_shapes(cls.name, c.shape, a.shape, b.shape), dtype)]


@register
class Cast(OpDef):
    name = "ember.cast"
    traits = ELEMENTWISE
    arity = (1, 1)
    attrs = {"dtype": str}

    @classmethod
    def infer(cls, operand_types, attrs):
        if attrs["dtype"] not in DTYPES:
            raise InferenceError(f"ember.cast to unknown dtype {attrs['dtype']!r}")
        return [operand_types[0].with_dtype(attrs["dtype"])]


class Reduce(OpDef):
    traits = frozenset({"pure", "reduction", "memory_bound"})
    arity = (1, 1)
    attrs = {"axes": list, "keepdims": bool}

    @classmethod
    def infer(cls, operand_types, attrs):
        (t,) = operand_types
        axes = normalize_axes(cls.name, attrs["axes"], t.rank)
        if attrs["keepdims"]:
            shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape))
        else:
            shape = tuple(d for i, d in enumerate(t.shape) if i not in axes)
        return [t.with_shape(shape)]


_declare(Reduce, "reduce_sum reduce_mean reduce_max")


@register
class Broadcast(OpDef):
    """numpy `broadcast_to(x, shape)`."""

    name = "ember.broadcast"
    arity = (1, 1)
    attrs = {"shape": list}

    @classmethod
    def infer(cls, operand_types, attrs):
        (t,) = operand_types
        shape = tuple(attrs["shape"])
        if len(shape) < t.rank or broadcast_shapes(cls.name, t.shape, shape) != shape:
            raise InferenceError(f"ember.broadcast: {fmt_shape(t.shape)} does not broadcast "
                                 f"to {fmt_shape(shape)}")
        return [t.with_shape(shape)]


@register
class Reshape(OpDef):
    name = "ember.reshape"
    arity = (1, 1)
    attrs = {"shape": list}

    @classmethod
    def infer(cls, operand_types, attrs):
        (t,) = operand_types
        shape = tuple(attrs["shape"])
        if int(np.prod(shape, dtype=np.int64)) != t.size or any(d < 0 for d in shape):
            raise InferenceError(f"ember.reshape: cannot reshape {fmt_shape(t.shape)} "
                                 f"to {fmt_shape(shape)}")
        return [t.with_shape(shape)]


@register
class Transpose(OpDef):
    name = "ember.transpose"
    arity = (1, 1)
    attrs = {"perm": list}

    @classmethod
    def infer(cls, operand_types, attrs):
        (t,) = operand_types
        perm = attrs["perm"]
        if sorted(perm) != list(range(t.rank)):
            raise InferenceError(f"ember.transpose: perm {perm} is not a permutation of "
                                 f"rank {t.rank}")
        return [t.with_shape(tuple(t.shape[p] for p in perm))]


@register
class Matmul(OpDef):
    """numpy matmul on operands of rank >= 2; batch dimensions broadcast."""

    name = "ember.matmul"
    traits = frozenset({"pure", "compute_bound"})
    arity = (2, 2)

    @classmethod
    def infer(cls, operand_types, attrs):
        a, b = operand_types
        dtype = same_dtype(cls.name, operand_types)
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
    attrs = {"num_classes": int, "dtype": str}

    @classmethod
    def infer(cls, operand_types, attrs):
        (t,) = operand_types
        if t.dtype not in ("i64", "i32"):
            raise InferenceError(f"ember.one_hot needs integer labels, got {t}")
        return [TensorType(t.shape + (attrs["num_classes"],), attrs["dtype"])]
