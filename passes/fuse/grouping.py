"""Which ops of a block share a kernel: each fusible op starts as a `Group` of its own and
merges with the groups producing its operands when one iteration space embeds into the
other, subject to the cost rules (one reduced dim set per kernel, no reducing epilogue,
one matmul per kernel, no forward/backward mixing, no cycle between kernels, and on a
checkpointed graph no longer-lived inputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir import Block, Operation, Value
from .analysis import REDUCTIONS, VIEWS, Dims, describe

RECOMPUTE = "ember.recompute"  # the checkpoint pass's mark on recomputed copies


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


def duplicate_views(block: Block) -> None:
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


class Grouper:
    """The groups of `block`'s ops; `epilogues` and `reductions` are the pass's options."""

    def __init__(self, block: Block, forward: set[Operation], epilogues: bool, reductions: bool):
        self.block, self.epilogues, self.reductions = block, epilogues, reductions
        self.forward = forward
        self.pos = {op: i for i, op in enumerate(block.ops)}
        # in a checkpointed graph a backward kernel must not keep its inputs alive longer
        # than the unfused ops did (recomputed copies are meant to die right after use)
        self.checkpointed = any(op.attributes.get(RECOMPUTE) for op in block.ops)
        self.last_use = {r: max((self.pos.get(u, -1) for u, _ in r.uses), default=-1)
                         for op in block.ops for r in op.results}
        self.group: dict[Operation, Group] = {}
        self.groups: list[Group] = []
        self.now = -1  # position of the op run() is visiting

    def new_group(self, op: Operation) -> Group | None:
        d = describe(op)
        if d is None or (op.name in REDUCTIONS and not self.reductions):
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
            self.now = self.pos[op]
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
        """Whether prod reaches cons through some third group or op. Ops after the one
        being visited (`now`) are in no group yet and only reach later ops, never cons,
        so the search stops there instead of walking the rest of the graph."""
        seen, stack = set(), [u for u in self.users(prod) if self.group.get(u) is not cons
                              and self.group.get(u) is not prod]
        while stack:
            op = stack.pop()
            if op not in self.group and self.pos.get(op, self.now) > self.now:
                continue
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
            if not self.epilogues or host.matmul is None or red or host.reduce:
                return False
        return True
