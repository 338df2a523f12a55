"""Narrowing helpers for the type checker: the invariants a pass relies on, spelled out.

A `Value`'s type is `TensorType | ScalarType` and its `op` is `Operation | None`, but a
pass mostly works on a graph's body, where the verifier allows only tensors (scalar types
exist only inside the body of a `kernel.*` op), and on results of ops (a block argument
has no defining op). These helpers state that, and fail loudly if it ever stops holding.
"""

from __future__ import annotations

from ..ir import Operation, TensorType, Value


def tensor_type(v: Value) -> TensorType:
    """The type of `v`, a value outside a kernel body, hence a tensor."""
    t = v.type
    assert isinstance(t, TensorType), f"expected a tensor, got {v!r}"
    return t


def shape(v: Value) -> tuple[int, ...]:
    """The shape of a tensor value."""
    return tensor_type(v).shape


def rank(v: Value) -> int:
    """The rank of a tensor value."""
    return len(tensor_type(v).shape)


def producer(v: Value) -> Operation:
    """The op that defines `v`, a result (not a block argument)."""
    op = v.op
    assert op is not None, f"{v!r} is a block argument, not an op's result"
    return op
