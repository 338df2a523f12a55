"""Replaces each group of ops with its kernel op: `kernel.fused` (a scalar body over the
group's iteration space), `kernel.matmul` (a GEMM with the group's other ops as its
epilogue) or `kernel.conv2d` (a conv and its epilogue), with index maps for every
operand and result, in an order where every value is defined before use.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from ...ir import Block, Operation, Region, ScalarType, Value, lookup
from ...ir.dialects.ember_windows import ConvBase
from ...ir.dialects.kernel import check_kernel
from ...ir.opdef import normalize_axes
from ..narrow import tensor_type
from .analysis import (
    CONVS,
    CORES,
    REDUCTIONS,
    VIEWS,
    Dims,
    contiguous,
    kernel_op,
    splat_value,
    strided,
)
from .grouping import Group


def _topo(block: Block, groups: list[Group]) -> list[Group | Operation]:
    """Units (groups or unfused ops) in an order where every value is defined before use;
    among ready units, the one whose first op came first."""
    unit: dict[Operation, Group | Operation] = {}
    for g in groups:
        for op in g.ops:
            unit[op] = g
    pos = {op: i for i, op in enumerate(block.ops)}
    units: list[Group | Operation] = []
    seen: set[int] = set()
    for op in block.ops:
        u = unit.get(op, op)
        if id(u) not in seen:
            seen.add(id(u))
            units.append(u)
    ops_of = {id(u): (u.ops if isinstance(u, Group) else [u]) for u in units}
    deps: dict[int, set[int]] = {id(u): set() for u in units}
    users: dict[int, set[int]] = {id(u): set() for u in units}
    for u in units:
        for op in ops_of[id(u)]:
            for v in op.operands:
                if v.op is not None and v.op in pos:
                    p = unit.get(v.op, v.op)
                    if p is not u:
                        deps[id(u)].add(id(p))
                        users[id(p)].add(id(u))
    by_id = {id(u): u for u in units}
    first = {id(u): min(pos[o] for o in ops_of[id(u)]) for u in units}
    last = {id(u): max(pos[o] for o in ops_of[id(u)]) for u in units}
    ready = [(last[k], first[k], k) for k, d in deps.items() if not d]
    heapq.heapify(ready)
    out: list[Group | Operation] = []
    while ready:
        _, _, k = heapq.heappop(ready)
        out.append(by_id[k])
        for s in users[k]:
            deps[s].discard(k)
            if not deps[s]:
                heapq.heappush(ready, (last[s], first[s], s))
    if len(out) != len(units):
        raise RuntimeError("fuse: kernels depend on each other in a cycle")
    return out


def emit(block: Block, groups: list[Group]) -> None:
    order = _topo(block, groups)
    term = block.ops[-1]
    new_ops: list[Operation] = []
    for u in order:
        if isinstance(u, Group):
            if _trivial(u):
                new_ops.extend(u.ops)
                continue
            k = _Kernel(u)
            if k.outputs:  # else every value of the group is dead
                new_ops.append(k.build())
        elif u is not term:
            new_ops.append(u)
    new_ops.append(term)
    block.ops = []
    for op in new_ops:
        block.append(op)
    # the replaced member ops: drop them (their results have no uses left)
    for g in groups:
        if _trivial(g):
            continue
        for op in reversed(g.ops):
            op.drop_operands()
    dead: set[Operation] = set()  # views and constants left unread, each freeing what it read
    for op in reversed(block.ops):
        if op.name in VIEWS + ("ember.constant",) and not op.result.uses:
            op.drop_operands()
            op.parent = None
            dead.add(op)
    block.ops = [op for op in block.ops if op not in dead]


def _trivial(g: Group) -> bool:
    """A lone reshape or conv is left as it is (the backends alias a reshape of a
    contiguous buffer; a conv without an epilogue is the plain op; a lone transpose or
    broadcast is a copy kernel)."""
    return len(g.ops) == 1 and g.ops[0].name in ("ember.reshape", *CONVS)


class _Kernel:
    """Builds the kernel op of one group."""

    def __init__(self, g: Group):
        self.g = g
        members = set(g.ops)
        self.inside = {r for op in g.ops for r in op.results}
        self.outputs = [r for op in g.ops for r in op.results
                        if any(u not in members for u, _ in r.uses)]
        self.operands: list[Value] = []
        self.maps: list[list[int]] = []
        self.args: dict[tuple[int, tuple[int, ...]], int] = {}
        self.block = Block()
        self.scalar: dict[Value, Value] = {}
        core = g.core
        self.rank = len(g.space)
        if core is not None:  # kernel space [batch..., M, N, K] or [N, O, OH, OW]
            out = tensor_type(core.result).shape
            dims = g.vdims[core.result]
            self.kspace = list(out)
            if core.name == "ember.matmul":
                self.kspace.append(tensor_type(core.operands[0]).shape[-1])
            self.to_k = {d: i for i, d in enumerate(dims) if d is not None}
        else:
            self.kspace = list(g.space)
            self.to_k = {d: d for d in range(len(g.space))}

    def stride_map(self, v: Value, dims: Dims, strides: list[int] | None = None) -> list[int]:
        m = [0] * len(self.kspace)
        for d, s in zip(dims, strides or contiguous(tensor_type(v).shape)):
            if d is not None:
                m[self.to_k[d]] += s
        return m

    def read(self, v: Value, dims: Dims) -> Value:
        """The scalar of operand `v` (read with `dims`) inside the body."""
        if v in self.inside:
            return self.scalar[v]
        c = splat_value(v)
        if c is not None:
            return self.const(c, v.type.dtype)
        m = self.stride_map(v, dims)
        key = (id(v), tuple(m))
        if key not in self.args:
            self.args[key] = len(self.block.args)
            self.operands.append(v)
            self.maps.append(m)
            self.block.add_arg(ScalarType(v.type.dtype))
        return self.block.args[self.args[key]]

    def add(self, name: str, operands: list[Value], attrs: dict[str, Any] | None = None,
            dtype: str | None = None) -> Value:
        d = lookup(name)
        assert d is not None, f"{name} is not a registered op"
        types = ([ScalarType(dtype)] if dtype else
                 d.result_types([v.type for v in operands], attrs or {}))
        assert types is not None, f"{name} does not infer its result types"
        op = Operation(name, operands, types, attrs or {})
        self.block.append(op)
        return op.result

    def const(self, value: float, dtype: str) -> Value:
        value = bool(value) if dtype == "i1" else (int(value) if dtype in ("i32", "i64")
                                                   else float(value))
        return self.add("kernel.constant", [], {"value": value}, dtype)

    def member(self, op: Operation) -> None:
        g, name = self.g, op.name
        dims = g.odims[op]
        if name in CORES:
            self.scalar[op.result] = self.block.args[0]
            return
        ins = [self.read(v, d) for v, d in zip(op.operands, dims)]
        a = op.attributes
        if name in VIEWS:
            r = ins[0]
        elif name in REDUCTIONS:
            axes = normalize_axes(name, a["axes"], tensor_type(op.operands[0]).rank)
            red = sorted({d for d in (dims[0][i] for i in axes) if d is not None})
            r = ins[0]
            if red:
                r = self.add("kernel.reduce", [r], {"kind": REDUCTIONS[name], "dims": red})
                if name == "ember.reduce_mean":
                    n = math.prod(tensor_type(op.operands[0]).shape[i] for i in axes)
                    r = self.add("kernel.div", [r, self.const(n, op.result.type.dtype)])
        elif name == "ember.dropout":
            shape = tensor_type(op.result).shape
            coords = [self.add("kernel.index", [], {"dim": self.to_k[d]}, "i64")
                      if d is not None else self.const(0, "i64")
                      for d in g.vdims[op.result]]
            keep = {**{k: a[k] for k in ("p", "seed", "key")}, "rows": shape[0] if shape else 0}
            r = self.add("kernel.dropout", [ins[0], ins[1], *coords], keep)
        elif name == "ember.one_hot":
            rd = g.vdims[op.result][-1]
            idx = (self.add("kernel.index", [], {"dim": self.to_k[rd]}, "i64") if rd is not None
                   else self.const(0, "i64"))
            lab = ins[0] if op.operands[0].type.dtype == "i64" else \
                self.add("kernel.cast", [ins[0]], {"dtype": "i64"})
            hit = self.add("kernel.cmp", [lab, idx], {"predicate": "eq"})
            r = self.add("kernel.cast", [hit], {"dtype": a["dtype"]})
        else:
            twin_name = kernel_op(name)  # not None: describe() fuses no other op here
            assert twin_name is not None, name
            twin = lookup(twin_name)  # takes the ember op's attributes
            assert twin is not None, twin_name
            r = self.add(twin.name, ins, {k: a[k] for k in (*twin.attrs, *twin.optional_attrs)
                                          if k in a})
        self.scalar[op.result] = r

    def build(self) -> Operation:
        g = self.g
        core = g.core
        mm = core if core is not None and core.name == "ember.matmul" else None
        if core is not None:
            self.block.add_arg(ScalarType(core.result.type.dtype))  # the product
        if core is not None and mm is None:
            self.operands += core.operands  # read as the conv reads them: no maps
        if mm is not None:
            a, sa = strided(mm.operands[0])
            b, sb = strided(mm.operands[1])
            nb = len(self.kspace) - 3
            maps: list[list[int]] = []
            for k, (st, (row, col)) in enumerate(zip((sa, sb), ((nb, nb + 2), (nb + 2, nb + 1)))):
                shape = tensor_type(mm.operands[k]).shape
                m = [0] * len(self.kspace)
                lead = nb - (len(shape) - 2)
                for i, d in enumerate(shape[:-2]):
                    m[lead + i] = st[i] if d != 1 else 0
                m[row], m[col] = st[-2], st[-1]
                maps.append(m)
            ma, mb = maps
            self.operands += [a, b]
            self.maps += [ma, mb]
        for op in g.ops:
            self.member(op)
        yields = [self.scalar[v] for v in self.outputs]
        self.block.append(Operation("kernel.yield", yields, []))
        out_maps = [self.stride_map(v, g.vdims[v]) for v in self.outputs]
        if core is not None:
            # the raw product first when it is stored, so the GEMM can accumulate there
            at = next((i for i, v in enumerate(self.outputs) if v is core.result), None)
            if at:
                self.outputs.insert(0, self.outputs.pop(at))
                out_maps.insert(0, out_maps.pop(at))
                yields.insert(0, yields.pop(at))
                term = self.block.ops[-1]
                term.drop_operands()
                for y in yields:
                    term.add_operand(y)
        name = CORES[core.name] if core is not None else "kernel.fused"
        attrs = {"space": self.kspace, "maps": self.maps, "out_maps": out_maps,
                 "out_types": [v.type for v in self.outputs]}
        if core is not None and mm is None:
            attrs.update({k: core.attributes[k] for k in ConvBase.attrs})
        op = Operation(name, self.operands, [v.type for v in self.outputs], attrs,
                       [Region([self.block])], loc=g.ops[-1].loc)
        check_kernel(op)
        members = set(g.ops)
        for old, new in zip(self.outputs, op.results):
            for user, i in list(old.uses):
                if user not in members:
                    user.set_operand(i, new)
        return op
