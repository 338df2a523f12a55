"""`low-precision-storage`: a kernel result that holds bf16 (or f16) values in f32 is
stored in low precision and widened where it is read: half the bytes, the same values.

Mixed precision rounds every matmul's result to bf16 and widens it for what follows
(passes/autocast.py, widen.py), so after `fuse` many kernels yield `kernel.cast` to f32 of
a bf16 value: a Linear's output kept for its backward (GELU's input), the gradients that a
bias's sum reads. Stored as f32 they cost twice the memory traffic they need (a GPT-2-small
step wrote ~650 MB of them). Where every reader is a kernel that reads the result into its
body (a `kernel.fused`, a product's epilogue), directly or through reshapes, the kernel
stores the bf16 value and each reader's body casts it to f32 first: the same f32 values.
A result the graph returns, or that a kernel reads another way (a GEMM's operand, an
attention's), stays as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir import Builder, Graph, Operation, ScalarType, Value
from ..ir.dialects.kernel import EPILOGUE_KERNELS, widening_cast
from .manager import Pass, register_pass
from .narrow import tensor_type

BODY_KERNELS = ("kernel.fused", *EPILOGUE_KERNELS)


def body_arg(op: Operation, k: int) -> Value | None:
    """The block argument through which `op`'s body reads its operand k, if it does (an
    epilogue kernel's first two operands are its product's, not its body's)."""
    if op.name not in BODY_KERNELS:
        return None
    args = op.regions[0].blocks[0].args
    if op.name == "kernel.fused":
        return args[k]
    return args[k - 1] if k >= 2 else None


@register_pass
@dataclass(frozen=True)
class LowPrecisionStorage(Pass):
    name: ClassVar[str] = "low-precision-storage"

    def apply(self, graph: Graph) -> Graph:
        for op in graph.body.ops:
            if op.name in BODY_KERNELS:
                for k in range(len(op.results)):
                    _narrow(op, k)
        return graph


def _narrow(op: Operation, k: int) -> None:
    """Result k of `op` stored in low precision, where its body yields a widened
    low-precision value and only bodies read it."""
    result, yield_op = op.results[k], op.regions[0].blocks[0].ops[-1]
    cast = widening_cast(op, k)
    if cast is None:
        return
    reads = _reads(result)
    if reads is None:
        return
    low = cast.operands[0]
    dtype = low.type.dtype
    readers, reshapes = reads
    t = tensor_type(result).with_dtype(dtype)
    result.type = t
    op.attributes["out_types"] = [t if i == k else u
                                  for i, u in enumerate(op.attributes["out_types"])]
    yield_op.set_operand(k, low)
    if not cast.result.uses:
        cast.erase()
    for v in reshapes:
        v.type = tensor_type(v).with_dtype(dtype)
    for reader, i in readers:
        _widen_arg(reader, i, dtype)


def _reads(v: Value) -> tuple[list[tuple[Operation, int]], list[Value]] | None:
    """(the (kernel, operand) pairs whose bodies read `v`, the reshapes between), or None
    where anything else reads it."""
    readers: list[tuple[Operation, int]] = []
    reshapes: list[Value] = []
    for user, i in v.uses:
        if user.name == "ember.reshape":
            inner = _reads(user.result)
            if inner is None:
                return None
            readers += inner[0]
            reshapes += [user.result, *inner[1]]
        elif body_arg(user, i) is not None:
            readers.append((user, i))
        else:
            return None
    return readers, reshapes


def _widen_arg(op: Operation, i: int, dtype: str) -> None:
    """`op`'s body reads its operand i as `dtype` and casts it to f32 first."""
    arg = body_arg(op, i)
    assert arg is not None  # _reads found it
    uses = list(arg.uses)
    arg.type = ScalarType(dtype)
    block = op.regions[0].blocks[0]
    widened = Builder(block, before=block.ops[0]).op("kernel.cast", arg, dtype="f32")
    for user, j in uses:
        user.set_operand(j, widened)
