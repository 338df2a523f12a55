"""CUDA C for the `kernel` dialect: `kernel.fused` and the epilogue of `kernel.matmul`.

A body's scalar ops become C statements through `scalar.expr`, the same expressions the
per-op kernels use. A fused kernel without `kernel.reduce` is a map kernel over its space.
One with reductions splits the space into outer dims and the reduced dims and runs in
phases: phase j loops over the reduced dims computing what reduce j consumes and
combines it (one block per outer point with warp shuffles when the innermost space dim
is reduced; else one thread per outer point looping serially, so neighbouring threads
read neighbouring addresses); a last loop stores the results that vary along the reduced
dims, and the results uniform along them are stored once. A phase recomputes what it
needs from the operands rather than keeping the row (layer norm reads x three times,
from L2 when the row is small).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ...ir import Operation, Value
from ...ir.dialects.kernel import accumulator_dtype, epilogue_maps, varying
from ..errors import UnsupportedOpError
from ..strides import collapse, contiguous_strides
from . import launch as L
from .scalar import ITEMSIZE, cast, combine, ctype, dropout, expr, literal
from .templates import (
    Kernel,
    Operand,
    block_reduce,
    coordinate,
    indent,
    map_kernel,
    offsets,
    reduce_acc,
    signature,
)


class Body:
    """The scalar body of a `kernel.*` op, emitted as C statements on demand."""

    def __init__(self, op: Operation):
        block = op.regions[0].blocks[0]
        self.op, self.args = op, block.args
        self.ops = block.ops[:-1]
        self.yields = block.ops[-1].operands
        self.names: dict[Value, str] = {v: f"v{k}" for k, s in enumerate(self.ops)
                                        for v in s.results}

    def cone(self, targets: Sequence[Value], known: dict[Value, str],
             arg: Callable[[int], str], index: Callable[[int], str]) -> tuple[list[str], list[str]]:
        """Statements computing `targets` from block arguments (`arg(k)`: the C expression
        of argument k) and `known` values, and the targets' C expressions."""
        need: set[Value] = set()
        todo = [t for t in targets if t not in known]
        while todo:
            v = todo.pop()
            if v in need or v in known:
                continue
            need.add(v)
            if v.op is not None:  # (dropout with p = 0 is x: it reads no step nor index)
                drop0 = v.op.name == "kernel.dropout" and not v.op.attributes["p"]
                todo += v.op.operands[:1] if drop0 else v.op.operands
        lines = []
        names = dict(known)
        for k, a in enumerate(self.args):
            if a in need:
                names[a] = arg(k)
        for s in self.ops:
            r = s.results[0]
            if r not in need:
                continue
            if s.name == "kernel.reduce":
                raise UnsupportedOpError(f"{self.op.name}: a kernel.reduce result is used "
                                         "before its phase (internal error)")
            t = ctype(r.type.dtype)
            if s.name == "kernel.constant":
                e = literal(r.type.dtype, s.attributes["value"])
            elif s.name == "kernel.index":
                e = f"(long long){index(s.attributes['dim'])}"
            elif s.name == "kernel.dropout":
                x, step, *coords = (names.get(u, "0") for u in s.operands)
                e = dropout(x, step, coords, s.attributes, r.type.dtype,
                            s.attributes.get("rows", 0))
                # p = 0: step and the coordinates were not computed
            else:
                src = s.operands[1 if s.name == "kernel.select" else 0].type.dtype
                e = expr(s.name, s.attributes, [names[x] for x in s.operands], src)
            lines.append(f"const {t} {self.names[r]} = {e};")
            names[r] = self.names[r]
        return lines, [names[t] for t in targets]


def map_body(body: Body, space: Sequence[int]):
    """A map-kernel body computing every yielded value."""

    def emit(vals: list[str], i: str):
        return body.cone(body.yields, {}, lambda k: vals[k],
                         lambda d: coordinate(i, space, d))

    return emit


def fused_kernel(name: str, op: Operation, restrict: bool = True,
                 sm_count: int = L.DEFAULT_SMS) -> Kernel:
    """The kernel of a `kernel.fused` op: its operands are `in*`, its results `out*`."""
    at = op.attributes
    space, body = at["space"], Body(op)
    ins = [Operand(v.type.dtype, tuple(m)) for v, m in zip(op.operands, at["maps"])]
    outs = [Operand(t.dtype, tuple(m)) for t, m in zip(at["out_types"], at["out_maps"])]
    if any(s.name == "kernel.reduce" for s in body.ops):
        return _reduce_kernel(name, op, body, ins, outs, sm_count)
    return map_kernel(name, space, outs, ins, map_body(body, space), restrict=restrict,
                      sm_count=sm_count)


def epilogue_kernel(name: str, op: Operation, restrict: bool,
                    sm_count: int = L.DEFAULT_SMS) -> Kernel:
    """The epilogue of a `kernel.matmul` (over space [batch..., M, N]) or `kernel.conv2d`:
    `in0` is the product (contiguous), `in1...` the epilogue operands."""
    space, maps, out_maps = epilogue_maps(op)
    body = Body(op)
    ins = [Operand(accumulator_dtype(op), tuple(contiguous_strides(space)))] + [
        Operand(v.type.dtype, tuple(m)) for v, m in zip(op.operands[2:], maps)]
    outs = [Operand(t.dtype, tuple(m)) for t, m in zip(op.attributes["out_types"], out_maps)]
    return map_kernel(name, space, outs, ins, map_body(body, space), restrict=restrict,
                      sm_count=sm_count)


def _reduce_kernel(name: str, op: Operation, body: Body, ins: list[Operand],
                   outs: list[Operand], sm_count: int) -> Kernel:
    space = op.attributes["space"]
    reduces = [s for s in body.ops if s.name == "kernel.reduce"]
    rdims = sorted(reduces[0].attributes["dims"])
    odims = [d for d in range(len(space)) if d not in rdims]
    O = math.prod(space[d] for d in odims)
    R = math.prod(space[d] for d in rdims)
    row = R > 1 and len(space) - 1 in rdims
    var = varying(op)
    accs = [reduce_acc(s.attributes["kind"], s.result.type.dtype) for s in reduces]
    acc_bytes = max(ITEMSIZE[a[0]] for a in accs)
    plan = L.reduce_plan(O, R, row, acc_bytes, sm_count, allow_split=False)
    itype = L.index_type(math.prod(space), *(_reach(space, o.strides) for o in ins + outs))
    rshape, oshape = [space[d] for d in rdims], [space[d] for d in odims]

    def offs(idx: str, dims: list[int], bufs: list[tuple[str, Operand]]) -> list[str]:
        """Offsets along `dims` (outer or reduced) of the buffers a loop touches."""
        if not bufs:
            return []
        c = collapse([(space[d], tuple(o.strides[d] for _, o in bufs)) for d in dims])
        return offsets(idx, c, [n for n, _ in bufs], itype)

    def index_of(o: str, r: str):
        def index(d):
            return coordinate(o, oshape, odims.index(d)) if d in odims else \
                coordinate(r, rshape, rdims.index(d))
        return index

    def load(r_part: bool, used: set[int]):
        def arg(k):
            used.add(k)
            return f"in{k}[b{k}{f' + q{k}' if r_part else ''}]"
        return arg

    def guard(k: int, dims: list[int], shape: list[int], idx: str) -> str:
        once = [coordinate(idx, shape, j) + " == 0" for j, d in enumerate(dims)
                if outs[k].strides[d] == 0 and space[d] > 1]
        return f"if ({' && '.join(once)}) " if once else ""

    def rloop(used: set[int], stored: list[int], body_lines: list[str]) -> list[str]:
        bufs = [(f"q{k}", ins[k]) for k in sorted(used)] + [(f"s{k}", outs[k]) for k in stored]
        head = (f"for ({itype} r = threadIdx.x; r < {R}; r += blockDim.x) {{" if row else
                f"for ({itype} r = 0; r < {R}; ++r) {{")
        return [head, *indent(offs("r", rdims, bufs) + body_lines, 2), "}"]

    inner: list[str] = []
    known: dict[Value, str] = {}
    all_used: set[int] = set()
    for j, (s, (acc_dt, kind, ident)) in enumerate(zip(reduces, accs)):
        src = s.operands[0].type.dtype
        used: set[int] = set()
        stmts, (val,) = body.cone([s.operands[0]], known, load(True, used), index_of("o", "r"))
        acc, acc_t = f"acc{j}", ctype(acc_dt)
        inner += [f"{acc_t} {acc} = {ident};", *rloop(used, [], stmts + [
            f"{acc} = {combine(kind, acc, cast(val, src, acc_dt), acc_dt)};"])]
        if row:
            inner += block_reduce(acc, acc_t, kind, acc_dt, ident, plan.launch.block[0])
        r = s.result
        inner.append(f"const {ctype(r.type.dtype)} {body.names[r]} = "
                     f"{cast(acc, acc_dt, r.type.dtype)};")
        known[r] = body.names[r]
        all_used |= used
    rd = set(rdims)
    vary = [k for k, y in enumerate(body.yields) if var[y] & rd]
    once = [k for k in range(len(outs)) if k not in vary]
    if vary:
        used = set()
        stmts, vals = body.cone([body.yields[k] for k in vary], known, load(True, used),
                                index_of("o", "r"))
        inner += rloop(used, vary, stmts + [
            f"{guard(k, rdims, rshape, 'r')}out{k}[c{k} + s{k}] = {v};"
            for k, v in zip(vary, vals)])
        all_used |= used
    if once:
        used = set()
        stmts, vals = body.cone([body.yields[k] for k in once], known, load(False, used),
                                index_of("o", "0"))
        store = [*stmts, *[f"{guard(k, odims, oshape, 'o')}out{k}[c{k}] = {v};"
                           for k, v in zip(once, vals)]]
        inner += (["if (threadIdx.x == 0) {", *indent(store, 2), "}"] if row else store)
        all_used |= used
    if row:
        inner.append("__syncthreads();")
    bases = offs("o", odims, [(f"b{k}", ins[k]) for k in sorted(all_used)]
                 + [(f"c{k}", o) for k, o in enumerate(outs)])
    lines = [f"const {itype} n_out = {O};"]
    if row:
        lines += ["const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
                  f"for ({itype} o = blockIdx.x; o < n_out; o += gridDim.x) {{"]
    else:
        lines.append(f"for ({itype} o = ({itype})blockIdx.x * blockDim.x + threadIdx.x; "
                     f"o < n_out; o += ({itype})gridDim.x * blockDim.x) {{")
    lines += [*indent(bases + inner, 2), "}"]
    params = [(ctype(o.dtype), f"out{k}", True) for k, o in enumerate(outs)] + \
        [(ctype(o.dtype), f"in{k}", False) for k, o in enumerate(ins)]
    src = signature(name, params, plan.launch.block[0]) + " {\n" + \
        "\n".join(indent(lines, 2)) + "\n}\n"
    return Kernel(name, src, plan.launch, [p[1] for p in params])


def _reach(space, strides) -> int:
    return sum((d - 1) * s for d, s in zip(space, strides)) + 1
