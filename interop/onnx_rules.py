"""The op table's machinery, apart from its entries so that the modules holding them
(interop/onnx_ops.py, onnx_ops_logic.py, onnx_ops_index.py) all register into one table
without importing each other: `RULES`, `rule(...)` to add to it, `problems(node)` to check
a node against it, and the small readers every rule uses (`attr`, `fail`, `norm_axis`,
`ints`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .onnx_errors import OnnxImportError
from .onnx_read import Node

# ONNX TensorProto element types ember has (FLOAT, DOUBLE, FLOAT16, BFLOAT16, INT64, INT32,
# BOOL)
DTYPES = {1: "f32", 11: "f64", 10: "f16", 16: "bf16", 7: "i64", 6: "i32", 9: "i1"}


@dataclass(frozen=True)
class Rule:
    lower: Callable
    attrs: frozenset[str]
    static: frozenset[int]
    buffers: frozenset[int]
    check: Callable[[Node], list[str]] | None


RULES: dict[str, Rule] = {}


def rule(*ops: str, attrs: str = "", static=(), buffers=(), check=None):
    """Register `lower` for `ops`, understanding the space-separated `attrs`."""
    def register(lower):
        for op in ops:
            RULES[op] = Rule(lower, frozenset(attrs.split()), frozenset(static),
                             frozenset(buffers), check)
        return lower
    return register


def problems(node: Node) -> list[str]:
    """What of `node` ember does not support (empty: all of it is)."""
    r = RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if r is None:
        return [f"op {node.domain + '.' if node.domain else ''}{node.op_type} is not supported"]
    out = [f"attribute {a!r} is not supported" for a in node.attrs if a not in r.attrs]
    return out + (r.check(node) if r.check else [])


def attr(node: Node, name: str, default=None):
    v = node.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def fail(node: Node, what: str) -> OnnxImportError:
    return OnnxImportError(f"{node.where}: {what}")


def norm_axis(node: Node, axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise fail(node, f"axis {axis} is out of range for rank {ndim}")
    return axis % max(ndim, 1)


def ints(v) -> list[int]:
    return [int(i) for i in np.asarray(v).reshape(-1)]
