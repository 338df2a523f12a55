"""`fuse`: group core ops into `kernel.fused` / `kernel.matmul` ops with scalar bodies.

Backend-neutral: it only decides which ops share one loop nest; the interpreter, cpu and
cuda backends all run the `kernel` dialect it produces (see `ir/dialects/kernel.py`).

Every fusible op has an iteration space (its result's shape, or its input's for a
reduction, without size-1 dims) and says which space dim each dim of its operands and
result runs along. Ops are visited in order; each starts as a group of its own and then
merges with the groups that produce its operands when one space embeds into the other
with those dims matching (the other dims are matched by size). That one rule fuses:
- elementwise and broadcast chains, and transposes / size-1 reshapes (relabelled dims);
- reductions with their producers (fuse on read) and with consumers of the reduced value
  that run over the same rows (fuse on write): a row softmax, log-softmax with its loss,
  or a layer norm is one kernel whose body reduces in phases;
- a matmul with elementwise consumers of its output (bias, activation, residual, the
  optimizer's update), which become its epilogue.
Where to cut follows from the cost rules: a kernel reduces over one set of dims (a value
reduced along another axis is materialized and read by a second kernel); an epilogue
never reduces; two matmuls never share a kernel; nothing is recomputed — a value that
consumers outside its kernel read is stored as one more result of the kernel; and no
merge may create a cycle between kernels. On a joint training graph forward and backward
ops never share a kernel (a copy the checkpoint pass marks `ember.recompute` counts as
backward, so it stays where the backward reads it, and no forward kernel gains a result
only the backward reads); on a checkpointed graph a backward merge is refused when the
kernel would read a value later than the unfused ops did (it would live longer), so
fusing keeps the memory the strategy saved. Views (transpose, broadcast, reshape) and
splat constants are duplicated per use and folded into index maps and body constants,
so they are never copied.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import ClassVar

from ..ir import Block, Graph, Operation, Region, ScalarType, Value, lookup
from ..ir.dense import splat_element
from ..ir.dialects.kernel import check_kernel
from ..ir.opdef import has_trait, normalize_axes
from .manager import Pass, register_pass
from .memory import forward_ops

VIEWS = ("ember.transpose", "ember.broadcast", "ember.reshape")
RECOMPUTE = "ember.recompute"  # the checkpoint pass's mark on recomputed copies
REDUCTIONS = {"ember.reduce_sum": "add", "ember.reduce_mean": "add", "ember.reduce_max": "max"}
Dims = tuple  # one entry per dim of a value: the space dim it runs along, None for size 1


def contiguous(shape) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return out[::-1]


def splat_value(v: Value):
    """The element of a splat `ember.constant` (all elements equal), else None."""
    op = v.op
    if op is None or op.name != "ember.constant":
        return None
    first = splat_element(op.attributes["value"])
    return None if first is None else first.item()


@dataclass
class Group:
    """Ops that become one kernel, over `space`, reducing `reduce` (space dims)."""

    id: int
    space: list[int]
    ops: list[Operation] = field(default_factory=list)
    vdims: dict[Value, Dims] = field(default_factory=dict)  # results of members
    odims: dict[Operation, list[Dims]] = field(default_factory=dict)  # members' operands
    reduce: frozenset = frozenset()
    matmul: Operation | None = None
    backward: bool = False  # members run in the backward part (recomputed copies included)

    def remap(self, phi: dict[int, int]) -> None:
        def m(d: Dims) -> Dims:
            return tuple(None if x is None else phi[x] for x in d)
        self.vdims = {v: m(d) for v, d in self.vdims.items()}
        self.odims = {op: [m(d) for d in ds] for op, ds in self.odims.items()}
        self.reduce = frozenset(phi[d] for d in self.reduce)


def _space(shape) -> tuple[list[int], dict[int, int]]:
    keep = [i for i, d in enumerate(shape) if d != 1]
    return [shape[i] for i in keep], {i: k for k, i in enumerate(keep)}


def _aligned(shape, out, pos) -> Dims:
    """Dims of an operand read with numpy broadcasting against result shape `out`."""
    off = len(out) - len(shape)
    return tuple(None if d == 1 else pos[i + off] for i, d in enumerate(shape))


def describe(op: Operation) -> tuple[list[int], list[Dims], Dims, frozenset] | None:
    """(space, operand dims, result dims, reduced dims) of a fusible op; None otherwise."""
    name = op.name
    if len(op.results) != 1 or any(v.type.size == 0 for v in (*op.operands, op.result)):
        return None
    out = op.result.type.shape
    if name == "ember.matmul":
        if not op.result.type.is_float or op.result.type.dtype not in ("f32", "f64"):
            return None
        space, pos = _space(out)
        return space, [], tuple(pos.get(i) for i in range(len(out))), frozenset()
    if name in REDUCTIONS:
        t = op.operands[0].type
        if not t.is_float:
            return None
        axes = normalize_axes(name, op.attributes["axes"], t.rank)
        space, pos = _space(t.shape)
        red = frozenset(pos[a] for a in axes if a in pos)
        keep = op.attributes["keepdims"]
        res = tuple(None if (i in axes or i not in pos) else pos[i]
                    for i in range(t.rank) if keep or i not in axes)
        return space, [tuple(pos.get(i) for i in range(t.rank))], res, red
    space, pos = _space(out)
    res = tuple(pos.get(i) for i in range(len(out)))
    if name == "ember.transpose":
        perm = op.attributes["perm"]
        src = [None] * len(perm)
        for j, p in enumerate(perm):
            src[p] = pos.get(j)
        return space, [tuple(src)], res, frozenset()
    if name == "ember.reshape":
        shape = op.operands[0].type.shape
        if [d for d in shape if d != 1] != space:
            return None
        it = iter(range(len(space)))
        return space, [tuple(None if d == 1 else next(it) for d in shape)], res, frozenset()
    if name == "ember.one_hot":
        labels = op.operands[0].type.shape
        return space, [tuple(None if d == 1 else pos[i] for i, d in enumerate(labels))], \
            res, frozenset()
    if name == "ember.broadcast" or name == "ember.dropout" or (
            has_trait(name, "elementwise") and
                                     lookup("kernel." + name.removeprefix("ember.")) and
                                     name.startswith("ember.")):
        return space, [_aligned(v.type.shape, out, pos) for v in op.operands], res, frozenset()
    return None


def strided(v: Value) -> tuple[Value, list[int]]:
    """`v` as (base value, element strides): transposes, broadcasts and reshapes that keep
    a strided layout are looked through, so a matmul reads them in place."""
    op = v.op
    shape = v.type.shape
    if op is None or op.name not in VIEWS:
        return v, contiguous(shape)
    base, st = strided(op.operands[0])
    src = op.operands[0].type.shape
    if op.name == "ember.transpose":
        return base, [st[p] for p in op.attributes["perm"]]
    if op.name == "ember.broadcast":
        off = len(shape) - len(src)
        return base, [0 if i < off or src[i - off] == 1 else st[i - off]
                      for i in range(len(shape))]
    new = _reshape_strides(src, st, shape)
    return (base, new) if new is not None else (v, contiguous(shape))


def _reshape_strides(src, st, shape) -> list[int] | None:
    """Strides that read a strided `src` layout as `shape` without a copy, if any."""
    dims = [(d, s) for d, s in zip(src, st) if d != 1]
    out, i = [], 0
    want = [d for d in shape]
    j = 0
    while j < len(want):
        d = want[j]
        if d == 1:
            out.append(0)
            j += 1
            continue
        if i >= len(dims):
            return None
        # gather source dims until their product is a multiple of d, or split one
        size, stride = dims[i]
        if size % d == 0:
            out.append(stride * (size // d))
            dims[i] = (size // d, stride)
            if size // d == 1:
                i += 1
            j += 1
            continue
        if d % size == 0:  # merge consecutive source dims when they are contiguous
            prod, k = size, i
            while prod < d and k + 1 < len(dims) and dims[k][1] == dims[k + 1][0] * dims[k + 1][1]:
                k += 1
                prod *= dims[k][0]
            if prod != d:
                return None
            out.append(dims[k][1])
            i = k + 1
            j += 1
            continue
        return None
    return out if i >= len(dims) else None


@register_pass
@dataclass(frozen=True)
class Fuse(Pass):
    """Options: `epilogues` (fuse matmul consumers), `reductions` (fuse reductions)."""

    name: ClassVar[str] = "fuse"
    epilogues: bool = True
    reductions: bool = True

    def apply(self, graph: Graph) -> Graph:
        _duplicate_views(graph.body)
        groups = _Grouper(graph.body, self, forward_ops(graph)).run()
        _emit(graph.body, groups)
        return graph


def _duplicate_views(block: Block) -> None:
    """One copy of each view op per use, so each reader folds its own into its maps."""
    for op in list(block.ops):
        if op.name not in VIEWS or len(op.result.uses) < 2:
            continue
        for user, i in list(op.result.uses)[1:]:
            clone = Operation(op.name, list(op.operands), [op.result.type],
                              dict(op.attributes), loc=op.loc)
            block.insert_before(user if user.parent is block else op, clone)
            user.set_operand(i, clone.result)
    # views may now be out of order only if inserted before their user: they are


class _Grouper:
    def __init__(self, block: Block, opts: Fuse, forward: set[Operation]):
        self.block, self.opts = block, opts
        self.forward = forward
        self.pos = {op: i for i, op in enumerate(block.ops)}
        # in a checkpointed graph a backward kernel must not keep its inputs alive longer
        # than the unfused ops did (recomputed copies are meant to die right after use)
        self.checkpointed = any(op.attributes.get(RECOMPUTE) for op in block.ops)
        self.last_use = {r: max((self.pos.get(u, -1) for u, _ in r.uses), default=-1)
                         for op in block.ops for r in op.results}
        self.group: dict[Operation, Group] = {}
        self.groups: list[Group] = []

    def new_group(self, op: Operation) -> Group | None:
        d = describe(op)
        if d is None or (op.name in REDUCTIONS and not self.opts.reductions):
            return None
        space, odims, rdims, red = d
        g = Group(len(self.groups), space, [op], {op.result: rdims},
                  {op: odims}, red, op if op.name == "ember.matmul" else None,
                  op not in self.forward or bool(op.attributes.get(RECOMPUTE)))
        self.groups.append(g)
        self.group[op] = g
        return g

    def run(self) -> list[Group]:
        for op in list(self.block.ops):
            g = self.new_group(op)
            if g is not None and g.matmul is not None:
                self.absorb_views(op)
            if g is None or g.matmul is not None:
                continue
            for v in op.operands:
                p = self.group.get(v.op)
                g = self.group[op]
                if p is not None and p is not g:
                    self.try_merge(g, p)
        return [g for g in self.groups if g.ops]

    def absorb_views(self, mm: Operation) -> None:
        """A matmul reads transposed (broadcast, reshaped) operands in place through its
        maps: their view ops leave their groups (and die once the kernel is built)."""
        for v in mm.operands:
            while v.op is not None and v.op.name in VIEWS and len(v.uses) == 1:
                g = self.group.pop(v.op, None)
                if g is not None:
                    g.ops.remove(v.op)
                    g.vdims.pop(v, None)
                    g.odims.pop(v.op, None)
                v = v.op.operands[0]

    # -- merging ---------------------------------------------------------------------------

    def users(self, g: Group):
        for op in g.ops:
            for r in op.results:
                for user, _ in r.uses:
                    yield user

    def extends_inputs(self, a: Group, b: Group) -> bool:
        """Whether one kernel for a and b (placed at its last member) would read a planned
        value (not a param, argument or constant) later than its last reader in the
        unfused order does, so that the value would live longer."""
        members = set(a.ops) | set(b.ops)
        end = max(self.pos[op] for op in members)
        for op in members:
            for v in op.operands:
                while v.op is not None and v.op.name in VIEWS and v.op not in members:
                    v = v.op.operands[0]  # a view is read in place: its base is the input
                p = v.op
                if p is None or p in members or p.name in ("ember.param", "ember.constant"):
                    continue
                if self.last_use.get(v, end) < end:
                    return True
        return False

    def creates_cycle(self, cons: Group, prod: Group) -> bool:
        """Whether prod reaches cons through some third group or op."""
        seen, stack = set(), [u for u in self.users(prod) if self.group.get(u) is not cons
                              and self.group.get(u) is not prod]
        while stack:
            op = stack.pop()
            node = self.group.get(op, op)
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node is cons:
                return True
            ops = node.ops if isinstance(node, Group) else [node]
            for o in ops:
                for r in o.results:
                    for user, _ in r.uses:
                        if self.group.get(user) is cons:
                            return True
                        if self.group.get(user) is not prod:
                            stack.append(user)
        return False

    def try_merge(self, cons: Group, prod: Group) -> bool:
        if cons.matmul is not None and prod.matmul is not None:
            return False
        if cons.backward != prod.backward:
            return False  # forward and backward (recomputed) ops never share a kernel
        if self.checkpointed and cons.backward and self.extends_inputs(cons, prod):
            return False
        pairs = []
        for op in cons.ops:
            if op.name == "ember.matmul":
                if any(v in prod.vdims for v in op.operands):
                    return False  # a GEMM reads materialized operands
                continue
            for i, v in enumerate(op.operands):
                if v in prod.vdims:
                    for a, b in zip(cons.odims[op][i], prod.vdims[v]):
                        if (a is None) != (b is None):
                            return False
                        if a is not None:
                            pairs.append((a, b))
        fwd: dict[int, int] = {}
        back: dict[int, int] = {}
        for a, b in pairs:
            if fwd.setdefault(a, b) != b or back.setdefault(b, a) != a:
                return False
        options = [(prod, cons, fwd), (cons, prod, back)]
        if len(cons.space) > len(prod.space):
            options.reverse()
        for host, small, phi in options:
            phi = self.embed(host, small, phi)
            if phi is None or not self.allowed(host, small, phi):
                continue
            if self.creates_cycle(cons, prod):
                return False
            small.remap(phi)
            host.reduce = host.reduce | small.reduce
            host.vdims.update(small.vdims)
            host.odims.update(small.odims)
            host.matmul = host.matmul or small.matmul
            host.ops = sorted(host.ops + small.ops, key=self.pos.__getitem__)
            for op in small.ops:
                self.group[op] = host
            small.ops = []
            return True
        return False

    @staticmethod
    def embed(host: Group, small: Group, phi: dict[int, int]) -> dict[int, int] | None:
        """Extend phi (small dim -> host dim) to every dim of small, matching by size."""
        phi = dict(phi)
        if any(small.space[a] != host.space[b] for a, b in phi.items()):
            return None
        used = set(phi.values())
        for d, size in enumerate(small.space):
            if d in phi:
                continue
            free = [h for h, hs in enumerate(host.space) if h not in used and hs == size]
            if not free:
                return None
            phi[d] = free[0]
            used.add(free[0])
        return phi

    def allowed(self, host: Group, small: Group, phi: dict[int, int]) -> bool:
        red = frozenset(phi[d] for d in small.reduce)
        if host.reduce and red and red != host.reduce:
            return False
        if host.matmul is not None or small.matmul is not None:
            if not self.opts.epilogues or host.matmul is None or red or host.reduce:
                return False
        return True


# -- emission -------------------------------------------------------------------------------

def _topo(block: Block, groups: list[Group]) -> list:
    """Units (groups or unfused ops) in an order where every value is defined before use;
    among ready units, the one whose first op came first."""
    unit: dict[Operation, object] = {}
    for g in groups:
        for op in g.ops:
            unit[op] = g
    pos = {op: i for i, op in enumerate(block.ops)}
    units, seen = [], set()
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
    out = []
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


def _emit(block: Block, groups: list[Group]) -> None:
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
    for op in reversed(list(block.ops)):
        if op.name in VIEWS + ("ember.constant",) and not op.result.uses:
            op.erase()


def _trivial(g: Group) -> bool:
    """A lone view or a lone matmul-less reshape is left as it is (the backends alias a
    reshape of a contiguous buffer; a lone transpose or broadcast is a copy kernel)."""
    return len(g.ops) == 1 and g.ops[0].name == "ember.reshape"


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
        self.args: dict[tuple, int] = {}
        self.block = Block()
        self.scalar: dict[Value, Value] = {}
        mm = g.matmul
        self.rank = len(g.space)
        if mm is not None:  # kernel space [batch..., M, N, K]; group dims map into it
            out = mm.result.type.shape
            dims = g.vdims[mm.result]
            self.kspace = list(out) + [mm.operands[0].type.shape[-1]]
            self.to_k = {d: i for i, d in enumerate(dims) if d is not None}
        else:
            self.kspace = list(g.space)
            self.to_k = {d: d for d in range(len(g.space))}

    def stride_map(self, v: Value, dims: Dims, strides=None) -> list[int]:
        m = [0] * len(self.kspace)
        for d, s in zip(dims, strides or contiguous(v.type.shape)):
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

    def add(self, name: str, operands: list[Value], attrs=None, dtype: str | None = None):
        d = lookup(name)
        types = ([ScalarType(dtype)] if dtype else
                 d.result_types([v.type for v in operands], attrs or {}))
        op = Operation(name, operands, types, attrs or {})
        self.block.append(op)
        return op.result

    def const(self, value, dtype: str) -> Value:
        value = bool(value) if dtype == "i1" else (int(value) if dtype in ("i32", "i64")
                                                   else float(value))
        return self.add("kernel.constant", [], {"value": value}, dtype)

    def member(self, op: Operation) -> None:
        g, name = self.g, op.name
        dims = g.odims[op]
        if name == "ember.matmul":
            self.scalar[op.result] = self.block.args[0]
            return
        ins = [self.read(v, d) for v, d in zip(op.operands, dims)]
        a = op.attributes
        if name in VIEWS:
            r = ins[0]
        elif name in REDUCTIONS:
            axes = normalize_axes(name, a["axes"], op.operands[0].type.rank)
            red = sorted({dims[0][i] for i in axes if dims[0][i] is not None})
            r = ins[0]
            if red:
                r = self.add("kernel.reduce", [r], {"kind": REDUCTIONS[name], "dims": red})
                if name == "ember.reduce_mean":
                    n = math.prod(op.operands[0].type.shape[i] for i in axes)
                    r = self.add("kernel.div", [r, self.const(n, op.result.type.dtype)])
        elif name == "ember.dropout":
            shape = op.result.type.shape
            flat = None
            for d, st in zip(g.vdims[op.result], contiguous(shape)):
                if d is None:
                    continue
                i = self.add("kernel.index", [], {"dim": self.to_k[d]}, "i64")
                if st != 1:
                    i = self.add("kernel.mul", [i, self.const(st, "i64")])
                flat = i if flat is None else self.add("kernel.add", [flat, i])
            flat = flat if flat is not None else self.const(0, "i64")
            keep = {k: a[k] for k in ("p", "seed", "key")}
            r = self.add("kernel.dropout", [ins[0], ins[1], flat], keep)
        elif name == "ember.one_hot":
            rd = g.vdims[op.result][-1]
            idx = (self.add("kernel.index", [], {"dim": self.to_k[rd]}, "i64") if rd is not None
                   else self.const(0, "i64"))
            lab = ins[0] if op.operands[0].type.dtype == "i64" else \
                self.add("kernel.cast", [ins[0]], {"dtype": "i64"})
            hit = self.add("kernel.cmp", [lab, idx], {"predicate": "eq"})
            r = self.add("kernel.cast", [hit], {"dtype": a["dtype"]})
        else:
            kname = "kernel." + name.removeprefix("ember.")
            keep = {k: a[k] for k in ("predicate", "dtype") if k in a}
            r = self.add(kname, ins, keep)
        self.scalar[op.result] = r

    def build(self) -> Operation:
        g = self.g
        mm = g.matmul
        if mm is not None:
            self.block.add_arg(ScalarType(mm.result.type.dtype))  # the accumulator
            a, sa = strided(mm.operands[0])
            b, sb = strided(mm.operands[1])
            nb = len(self.kspace) - 3
            maps = []
            for k, (st, (row, col)) in enumerate(zip((sa, sb), ((nb, nb + 2), (nb + 2, nb + 1)))):
                shape = mm.operands[k].type.shape
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
        if mm is not None:
            # the raw product first when it is stored, so the GEMM can accumulate there
            k = next((i for i, v in enumerate(self.outputs) if v is mm.result), None)
            if k:
                for lst in (self.outputs, out_maps):
                    lst.insert(0, lst.pop(k))
                yields.insert(0, yields.pop(k))
                term = self.block.ops[-1]
                term.drop_operands()
                for y in yields:
                    term.add_operand(y)
        name = "kernel.matmul" if mm is not None else "kernel.fused"
        attrs = {"space": self.kspace, "maps": self.maps, "out_maps": out_maps,
                 "out_types": [v.type for v in self.outputs]}
        op = Operation(name, self.operands, [v.type for v in self.outputs], attrs,
                       [Region([self.block])], loc=g.ops[-1].loc)
        check_kernel(op)
        members = set(g.ops)
        for old, new in zip(self.outputs, op.results):
            for user, i in list(old.uses):
                if user not in members:
                    user.set_operand(i, new)
        return op


__all__ = ["Fuse"]
