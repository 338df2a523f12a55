"""`low-precision-attention`: a fused attention whose q, k and v (and its backward's do)
are f32 copies of bf16 values reads the bf16 values, and stores as bf16 a result that only
a cast to bf16 reads.

After `widen-low-precision` (passes/widen.py) a mixed-precision attention reaches `fuse`
on f32 casts of bf16 projections, and `fuse` makes each cast a `kernel.fused` of its own
(reading the bf16 buffer through a transpose, say) ahead of `kernel.attention`. A cpu with
AMX's bf16 tiles appends this pass after `fuse`: where all three operands come from such
casts, the attention reads the casts' bf16 inputs through the casts' maps instead (a
bf16 `kernel.attention` multiplies on the tiles: backends/cpu/attention/amx.py), and a
cast that nothing else reads goes. A kernel that computes a bf16 value before casting it
(a padded v's mask) stores the bf16 value too, for the attention. The backward
(`kernel.attention_grad`) reads its q, k, v and do so; its o and lse stay f32.

A result whose one reader is a kernel that only casts it to bf16 (the backward's dq, dk
and dv, headed for bf16 projections) is stored as bf16 by the attention itself (the same
rounding), in the layout that kernel's readers read, directly or through transposes (as
`fuse` folds the transposes of f32 results: fuse/attention.py): the cast and the
transposes go.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir import Builder, Graph, Operation, TensorType, Value
from ..ir.dialects.kernel import widening_cast
from ..ir.dialects.kernel_attention import (
    ATTENTION_OPS,
    AttentionOp,
    logical_shapes,
    result_maps,
)
from ..ir.opdef import OPS
from .fuse.analysis import contiguous
from .manager import Pass, register_pass
from .narrow import tensor_type


def bf16_source(v: Value, shape: list[int], m: list[int]) -> Operation | None:
    """The `kernel.cast` to f32 of a bf16 value in the body of the `kernel.fused` that
    stores `v`, where that kernel runs over `shape` and stores `v` in the layout that map
    `m` reads; else None."""
    op = v.op
    if op is None or op.name != "kernel.fused":
        return None
    a, k = op.attributes, op.results.index(v)
    cast = widening_cast(op, k)
    if cast is None or cast.operands[0].type.dtype != "bf16" \
            or list(a["space"]) != shape or list(a["out_maps"][k]) != list(m):
        return None
    return cast


def read_bf16(v: Value, cast: Operation, m: list[int]) -> tuple[Value, list[int]]:
    """(the bf16 value `cast` casts, its map): the kernel's bf16 input itself where its
    body is only that cast, else the value as one more result of the kernel (stored in
    `v`'s layout: a padded value's mask, say, computed before the cast)."""
    op = v.op
    assert op is not None  # bf16_source found its kernel
    body = op.regions[0].blocks[0]
    if len(body.ops) == 2 and cast.operands[0] is body.args[0]:
        return op.operands[0], list(op.attributes["maps"][0])
    return _stored_too(op, cast.operands[0], op.results.index(v)), list(m)


def _stored_too(op: Operation, x: Value, k: int) -> Value:
    """The new result of `op` (a `kernel.fused`, replaced) that stores its body's value
    `x` in the layout of its result k."""
    body, out_maps = op.regions[0].blocks[0], op.attributes["out_maps"]
    body.ops[-1].add_operand(x)
    region, op.regions = op.regions[0], []
    types = [r.type for r in op.results]
    types.append(tensor_type(op.results[k]).with_dtype("bf16"))
    attrs = {**op.attributes, "out_maps": [*out_maps, out_maps[k]], "out_types": types}
    new = Builder.before_op(op).create("kernel.fused", op.operands, attrs, types, [region])
    for old, r in zip(op.results, new.results):
        old.replace_all_uses_with(r)
    op.erase()
    return new.results[-1]


@register_pass
@dataclass(frozen=True)
class LowPrecisionAttention(Pass):
    name: ClassVar[str] = "low-precision-attention"

    def apply(self, graph: Graph) -> Graph:
        for op in list(graph.body.ops):
            if op.name in ATTENTION_OPS:
                _rewrite(op)
        return graph


def _rewrite(op: Operation) -> None:
    cls = OPS[op.name]
    assert issubclass(cls, AttentionOp)  # one of ATTENTION_OPS
    shapes, maps = logical_shapes(op.attributes), op.attributes["maps"]
    low = [i for i, n in enumerate(cls.operand_names) if n in cls.bf16_operands]
    if any(bf16_source(op.operands[i], shapes[cls.operand_names[i]], maps[i]) is None
           for i in low):
        return
    operands, new_maps = list(op.operands), [list(m) for m in maps]
    casts = [op.operands[i].op for i in low]
    for i in low:  # one at a time: a kernel may store two of them
        v, n = op.operands[i], cls.operand_names[i]
        cast = bf16_source(v, shapes[n], maps[i])
        assert cast is not None  # checked above; a kernel stored anew stores v still
        operands[i], new_maps[i] = read_bf16(v, cast, maps[i])
    new = Builder.before_op(op).create(op.name, operands, {**op.attributes, "maps": new_maps})
    for old, r in zip(op.results, new.results):
        old.replace_all_uses_with(r)
    op.erase()
    for kernel in dict.fromkeys(casts):
        if kernel is not None and not any(r.uses for r in kernel.results):
            kernel.erase()
    _store_bf16(new)


def _store_bf16(op: Operation) -> None:
    """Results of `op` whose one reader casts them to bf16 (stored in one layout, or
    in layouts the transposes after it all turn into one), stored as bf16 in that layout:
    the cast and those transposes go."""
    cls = OPS[op.name]
    assert issubclass(cls, AttentionOp)  # one of ATTENTION_OPS
    shapes, names = logical_shapes(op.attributes), cls.result_names
    maps = result_maps(op.name, op.attributes)
    types = [r.type for r in op.results]
    plans = {}
    for k, r in enumerate(op.results):
        cast = r.uses[0][0] if len(r.uses) == 1 else None
        if cast is None or not _casts_down(cast) or \
                list(cast.attributes["space"]) != shapes[names[k]] or \
                list(cast.attributes["maps"][0]) != list(maps[k]):
            continue
        plan = _one_layout(cast)
        if plan is not None:
            maps[k], types[k], readers = plan
            plans[k] = (cast, readers)
    if not plans:
        return
    op.attributes["out_maps"], op.attributes["out_types"] = maps, types
    for k, (cast, readers) in plans.items():
        op.results[k].type = types[k]
        for v in readers:
            v.replace_all_uses_with(op.results[k])
            if v.op is not None and v.op is not cast:
                v.op.erase()
        cast.erase()


def _one_layout(cast: Operation) -> tuple[list[int], TensorType, list[Value]] | None:
    """(map, type, values) where every reader of `cast`'s results reads one layout: a
    result read as it is, or through transposes (the values are those results and
    transposes, each of which the layout replaces); None where they read several."""
    layouts, values = set(), []
    for r, m in zip(cast.results, cast.attributes["out_maps"]):
        t = tensor_type(r)
        readers = [u for u, _ in r.uses]
        if readers and all(u.name == "ember.transpose" for u in readers):
            for u in readers:
                moved = _transposed(list(m), list(t.shape), list(u.attributes["perm"]))
                if moved is None:
                    return None
                layouts.add((tuple(moved), tensor_type(u.result)))
                values.append(u.result)
        else:
            layouts.add((tuple(m), t))
            values.append(r)
    if len(layouts) != 1:
        return None
    ((strides, t),) = layouts
    return list(strides), t, values


def _transposed(m: list[int], shape: list[int], perm: list[int]) -> list[int] | None:
    """Map `m` (strides into a contiguous buffer of `shape`) into that buffer transposed by
    `perm`; None where a stride is no single dim's (a broadcast, or size-1 dims)."""
    inner, outer = contiguous(shape), contiguous([shape[p] for p in perm])
    out = []
    for stride in m:
        dims = [b for b, (n, st) in enumerate(zip(shape, inner)) if st == stride and n > 1]
        if len(dims) != 1:
            return None
        out.append(outer[perm.index(dims[0])])
    return out


def _casts_down(op: Operation) -> bool:
    """Whether `op` is a `kernel.fused` that only casts its one operand to bf16 (and
    stores that, in one layout or several)."""
    if op.name != "kernel.fused" or len(op.operands) != 1:
        return False
    body = op.regions[0].blocks[0]
    cast = body.ops[0]
    return len(body.ops) == 2 and cast.name == "kernel.cast" and \
        cast.attributes["dtype"] == "bf16" and cast.operands[0] is body.args[0] and \
        all(v is cast.result for v in body.ops[-1].operands)
