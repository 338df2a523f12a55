"""Which ops of a block share a kernel: each fusible op starts as a `Group` of its own and
merges with the groups producing its operands when one iteration space embeds into the
other, subject to the cost rules (one reduced dim set per kernel, no reducing epilogue,
one matmul or conv per kernel, no forward/backward mixing, no cycle between kernels, no epilogue
result that only adds a store (`only_adds_a_result`), no stored value computed again along
dims it does not vary along (`repeats_stores`), and on a recomputed graph
recomputed copies grouped as their originals and no input kept alive at a cost). Before
that, a matmul whose rows a reshape splits (a Linear on [B, T, C]) is rewritten to
produce that shape itself (`unflatten_matmuls`), so its consumers can join it, and
`duplicate_views` gives each reader its own views.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...ir import Block, Operation, TensorType, Value
from ...ir.memory_plan import RESIDENT_OPS, nbytes
from ..narrow import producer, tensor_type
from .analysis import (
    CONVS,
    CORES,
    RECOMPUTE,
    REDUCTIONS,
    VIEWS,
    Description,
    Dims,
    describe,
    originals,
)

# an input of a group: (its last use, a tie breaker, the value, the ops on the way to it)
InputEntry = tuple[int, int, Value, list[Operation]]


@dataclass
class Group:
    """Ops that become one kernel, over `space`, reducing `reduce` (space dims)."""

    id: int
    space: list[int]
    ops: list[Operation] = field(default_factory=list)
    vdims: dict[Value, Dims] = field(default_factory=dict)  # results of members
    odims: dict[Operation, list[Dims]] = field(default_factory=dict)  # members' operands
    reduce: frozenset[int] = frozenset()
    core: Operation | None = None  # the matmul or conv2d whose epilogue the rest is
    backward: bool = False  # members run in the backward part (recomputed copies included)
    origin: Operation | None = None  # the forward op a recomputed member repeats, if any
    # ops outside the group that read its values / define values it reads: the group's
    # edges in the graph of groups, kept up to date by merges (see Grouper.creates_cycle)
    users: dict[Operation, None] = field(default_factory=dict)
    producers: dict[Operation, None] = field(default_factory=dict)
    # values read from outside, as a heap of (last use, tie, value, ops on the way to it):
    # entries whose ops joined the group are dropped lazily (see Grouper.earliest_input)
    inputs: list[InputEntry] = field(default_factory=list)
    end: int = -1  # position of the last member

    def remap(self, phi: dict[int, int]) -> None:
        def m(d: Dims) -> Dims:
            return tuple(None if x is None else phi[x] for x in d)
        self.vdims = {v: m(d) for v, d in self.vdims.items()}
        self.odims = {op: [m(d) for d in ds] for op, ds in self.odims.items()}
        self.reduce = frozenset(phi[d] for d in self.reduce)


def _row_split(op: Operation) -> list[int] | None:
    """The shape [*lead, N] that a reader reshapes rank-2 matmul op's [M, N] result to,
    with prod(lead) = M (its rows split, N kept), if one does."""
    if (op.name != "ember.matmul" or any(tensor_type(v).rank != 2 for v in op.operands)
            or describe(op) is None):
        return None
    m, n = tensor_type(op.result).shape
    for u, _ in op.result.uses:
        shape = list(u.attributes.get("shape", ())) if u.name == "ember.reshape" else []
        if len(shape) > 2 and shape[-1] == n and math.prod(shape[:-1]) == m:
            return shape
    return None


def unflatten_matmuls(block: Block) -> None:
    """A Linear on [B, T, C] is decomposed as a matmul of x flattened to [B*T, C] whose
    result is reshaped back to [B, T, N]; that split of the rows would stop the bias,
    activation and residual that follow from joining the GEMM as its epilogue. So the
    reshape moves to the operand: the matmul reads x as [B, T, C] (in place, a view) with
    the weight broadcast over B, its result is the [B, T, N] value itself, and any other
    reader of the flat product reads a view of it. The backends still run it as one GEMM
    with M = B*T (the batch dims are contiguous rows of A and C, and B does not vary)."""
    before: dict[Operation, list[Operation]] = {}
    dead: list[Operation] = []
    for op in block.ops:
        shape = _row_split(op)
        if shape is None:
            continue
        a, w = op.operands
        while a.op is not None and a.op.name == "ember.reshape":
            a = a.op.operands[0]  # a reshape of a reshape is one reshape
        new: list[Operation] = []
        rows = [*shape[:-1], tensor_type(w).shape[0]]
        if list(tensor_type(a).shape) != rows:
            new.append(Operation("ember.reshape", [a], [TensorType(tuple(rows), a.type.dtype)],
                                 {"shape": rows, **_marks(op)}, loc=op.loc))
            a = new[-1].result
        mm = Operation("ember.matmul", [a, w], [TensorType(tuple(shape), op.result.type.dtype)],
                       dict(op.attributes), loc=op.loc)
        new.append(mm)
        for u, i in list(op.result.uses):
            if u.name == "ember.reshape" and list(u.attributes["shape"]) == shape:
                u.result.replace_all_uses_with(mm.result)
            else:
                flat = Operation("ember.reshape", [mm.result], [op.result.type],
                                 {"shape": list(tensor_type(op.result).shape), **_marks(op)},
                                 loc=op.loc)
                new.append(flat)
                u.set_operand(i, flat.result)
        for n in new:
            n.parent = block
        before[op] = new
        dead += [u for u, _ in op.result.uses]  # the reshapes mm replaced
        dead.append(op)
        v = op.operands[0]
        while v.op is not None and v.op.name == "ember.reshape" and len(v.uses) == 1:
            dead.append(v.op)  # the flattening of x, once nothing else reads it
            v = v.op.operands[0]
    for op in dead:
        op.drop_operands()
        op.parent = None
    if before:  # (a view made for one matmul's other reader can die with the next one)
        gone = set(dead)
        block.ops = [new for op in block.ops for new in before.get(op, (op,))
                     if new not in gone]


def _allocates_nothing(op: Operation) -> bool:
    """Whether op's results take no planned memory to speak of (scalars, constants)."""
    return op.name in RESIDENT_OPS or all(tensor_type(r).size <= 1 for r in op.results)


def _marks(op: Operation) -> dict[str, Any]:
    """The recompute pass's mark of op, for the ops that replace it."""
    return {RECOMPUTE: op.attributes[RECOMPUTE]} if RECOMPUTE in op.attributes else {}


def duplicate_views(block: Block) -> None:
    """One copy of each view op per use, so each reader folds its own into its maps. Each
    copy goes just before its reader; the op list is rebuilt once, not searched per copy."""
    before: dict[Operation, list[Operation]] = {}
    for op in block.ops:
        if op.name not in VIEWS or len(op.result.uses) < 2:
            continue
        for user, i in list(op.result.uses)[1:]:
            clone = Operation(op.name, list(op.operands), [op.result.type],
                              dict(op.attributes), loc=op.loc)
            clone.parent = block
            before.setdefault(user if user.parent is block else op, []).append(clone)
            user.set_operand(i, clone.result)
    if before:
        block.ops = [new for op in block.ops for new in (*before.get(op, ()), op)]


class Grouper:
    """The groups of `block`'s ops; `epilogues` and `reductions` are the pass's options.
    Convs take epilogues only in a graph without a backward (`conv_epilogues`): in
    training a conv feeds BatchNorm's statistics, and a bias that joined it would be
    stored rather than added where the statistics read it (the recompute strategies'
    planned peaks rose past the unfused graph's)."""

    def __init__(self, block: Block, forward: set[Operation], epilogues: bool, reductions: bool,
                 conv_epilogues: bool = True):
        self.block, self.epilogues, self.reductions = block, epilogues, reductions
        self.conv_epilogues = conv_epilogues
        self.forward = forward
        self.pos = {op: i for i, op in enumerate(block.ops)}
        # in a recomputed graph a backward kernel must not keep its inputs alive longer
        # than the unfused ops did (recomputed copies are meant to die right after use),
        # and recomputed copies are grouped as the forward grouped their originals
        self.recomputed = any(op.attributes.get(RECOMPUTE) for op in block.ops)
        self.original = originals(block, forward) if self.recomputed else {}
        self.last_use = {r: max((self.pos.get(u, -1) for u, _ in r.uses), default=-1)
                         for op in block.ops for r in op.results}
        self.group: dict[Operation, Group] = {}
        self.groups: list[Group] = []
        self.now = -1  # position of the op run() is visiting
        self.tie = itertools.count()  # orders heap entries with equal last uses
        self.descriptions: dict[Operation, Description | None] = {}  # `describe`'s, each op once

    def new_group(self, op: Operation) -> Group | None:
        d = self.description(op)
        if d is None or (op.name in REDUCTIONS and not self.reductions):
            return None
        space, odims, rdims, red = d
        g = Group(len(self.groups), space, [op], {op.result: rdims},
                  {op: odims}, red, op if op.name in CORES else None,
                  self.in_backward(op), self.original.get(op))
        self.groups.append(g)
        self.group[op] = g
        self.index(g)
        return g

    def index(self, g: Group) -> None:
        """(Re)build g's edges, inputs and end from its members."""
        g.users, g.producers = self.outside(g, True), self.outside(g, False)
        g.inputs = [e for op in g.ops for e in self.input_entries(op)]
        heapq.heapify(g.inputs)
        g.end = max((self.pos[op] for op in g.ops), default=-1)

    def input_entries(self, op: Operation) -> list[InputEntry]:
        """Heap entries for the planned values op reads (views looked through: a view is
        read in place, its base is the input); params, constants and arguments are none."""
        out: list[InputEntry] = []
        for v in op.operands:
            way: list[Operation] = []
            while v.op is not None and v.op.name in VIEWS:
                way.append(v.op)
                v = v.op.operands[0]
            if v.op is None or v.op.name in ("ember.param", "ember.constant"):
                continue
            way.append(v.op)
            out.append((self.last_use[v], next(self.tie), v, way))
        return out

    def run(self) -> list[Group]:
        for op in list(self.block.ops):
            self.now = self.pos[op]
            g = self.new_group(op)
            if g is not None and g.core is not None and op.name == "ember.matmul":
                self.absorb_views(op)
            if g is None or g.core is not None:
                continue
            self.merge_producers(op)
        groups = [g for g in self.groups if g.ops]
        for g in groups:  # merges append; a kernel's body follows the block's order
            g.ops.sort(key=self.pos.__getitem__)
        return groups

    def merge_producers(self, op: Operation) -> None:
        """Merge op's group with the groups producing its operands, in operand order; one
        refused before another merge succeeded is tried again after it (the merged kernel
        may now hold what the refused one would have read past its last use), until no
        more merges succeed."""
        # operands without a defining op (block arguments) are in no group
        todo = [v.op for v in op.operands if v.op is not None]
        merged = True
        while todo and merged:
            refused: list[Operation] = []
            merged = False
            for source in todo:
                p, g = self.group.get(source), self.group[op]
                if p is None or p is g:
                    continue
                if self.try_merge(g, p):
                    merged = True
                else:
                    refused.append(source)
            todo = refused

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
                    self.index(g)
                v = v.op.operands[0]

    # -- merging ---------------------------------------------------------------------------

    @staticmethod
    def links(op: Operation, forward: bool) -> list[Operation]:
        """The ops reading op's results (forward) or defining its operands (backward)."""
        if forward:
            return [u for r in op.results for u, _ in r.uses]
        return [v.op for v in op.operands if v.op is not None]

    def outside(self, g: Group, forward: bool) -> dict[Operation, None]:
        """g.users (forward) or g.producers, recomputed from its members."""
        return {u: None for op in g.ops for u in self.links(op, forward)
                if self.group.get(u) is not g}

    def neighbours(self, node: Group | Operation, forward: bool) -> list[Operation]:
        """The ops outside a group (or a lone op) linked to it in that direction."""
        if isinstance(node, Group):
            return list(node.users if forward else node.producers)
        return self.links(node, forward)

    def other_origins(self, a: Group, b: Group) -> bool:
        """Whether a and b hold copies of ops that the forward ran in different kernels.
        Recomputed copies are grouped as their originals were, so their kernels repeat
        the forward's, layer after layer: one LLVM function each, not one per chain (a
        residual stream recomputed from the input is a chain as long as the depth)."""
        if a.origin is None or b.origin is None:
            return False
        return self.group.get(a.origin, a.origin) is not self.group.get(b.origin, b.origin)

    def extends_inputs(self, a: Group, b: Group) -> bool:
        """Whether one kernel for a and b (placed at its last member) would keep a planned
        value (not a param, argument or constant) alive past its last reader in the
        unfused order, at a cost: while some other op runs (only ops that allocate
        nothing, scalars and constants, may run in between), or beside more bytes of
        results than the kernel saves by never storing its temporaries. So an optimizer
        update may read its gradient first and last, a recomputed layer norm its input
        twice: the centred copy it no longer stores is as large."""
        end = max(a.end, b.end)
        first = min(self.earliest_input(a, b), self.earliest_input(b, a))
        if first >= end:
            return False
        for op in self.block.ops[int(first) + 1:end + 1]:
            g = self.group.get(op)
            if g is not a and g is not b and not _allocates_nothing(op):
                return True
        inside = (a, b)
        late = {v for last, _, v, way in (*a.inputs, *b.inputs)
                if last < end and all(self.group.get(op) not in inside for op in way)}
        temporaries = {r for op in (*a.ops, *b.ops) for r in op.results
                       if self.last_use[r] > first
                       and all(self.group.get(u) in inside for u, _ in r.uses)}
        return sum(map(nbytes, late)) > sum(map(nbytes, temporaries))

    def earliest_input(self, g: Group, other: Group) -> float:
        """The earliest last use of a value g reads from outside g and other. Entries that
        reach into g are dropped for good (groups only grow); those reaching into other
        are put back, so a check costs the edges between the two, not g's size."""
        heap = g.inputs
        held: list[InputEntry] = []
        while heap:
            way = heap[0][3]
            if any(self.group.get(op) is g for op in way):
                heapq.heappop(heap)
            elif any(self.group.get(op) is other for op in way):
                held.append(heapq.heappop(heap))
            else:
                break
        first = heap[0][0] if heap else float("inf")
        for e in held:
            heapq.heappush(heap, e)
        return first

    def creates_cycle(self, cons: Group, prod: Group) -> bool:
        """Whether prod reaches cons through some third group or op. Two searches take
        turns, one forward from prod's readers, one backward from cons's producers, and
        the first to finish answers, so a check costs about the smaller of the two
        regions: an optimizer update reading a gradient made early in the backward has a
        tiny backward region, a backward op reading its neighbour a tiny forward one."""
        searches = (self.search(prod, cons, True), self.search(cons, prod, False))
        while True:
            for s in searches:
                found = next(s)
                if found is not None:
                    return found

    def search(self, start: Group, goal: Group, forward: bool) -> Iterator[bool | None]:
        """Yields None after each node it expands, then whether a path leaving `start`
        reaches `goal` through some third node. Ops after the one being visited (`now`)
        are in no group yet and only reach later ops, so a forward search stops there."""
        seen: set[int] = set()
        stack = [u for u in self.neighbours(start, forward) if self.group.get(u) is not goal]
        while stack:
            op = stack.pop()
            if op not in self.group and self.pos.get(op, self.now) > self.now:
                continue
            node = self.group.get(op, op)
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node is goal:
                yield True
            for other in self.neighbours(node, forward):
                if self.group.get(other) is goal:
                    yield True
                if self.group.get(other) is not start:
                    stack.append(other)
            yield None
        yield False

    def try_merge(self, cons: Group, prod: Group) -> bool:
        if cons.core is not None and prod.core is not None:
            return False
        if cons.backward != prod.backward:
            return False  # forward and backward (recomputed) ops never share a kernel
        if self.recomputed and cons.backward and (self.other_origins(cons, prod)
                                                    or self.extends_inputs(cons, prod)):
            return False
        if self.only_adds_a_result(cons, prod):
            return False
        pairs: list[tuple[int, int]] = []
        for op in cons.ops:
            if op.name in CORES:
                if any(v in prod.vdims for v in op.operands):
                    return False  # a GEMM or conv reads materialized operands
                continue
            for i, v in enumerate(op.operands):
                if v in prod.vdims:
                    for a, b in zip(cons.odims[op][i], prod.vdims[v]):
                        if (a is None) != (b is None):
                            return False
                        if a is not None and b is not None:
                            pairs.append((a, b))
        fwd: dict[int, int] = {}
        back: dict[int, int] = {}
        for a, b in pairs:
            if fwd.setdefault(a, b) != b or back.setdefault(b, a) != a:
                return False
        options = [(prod, cons, fwd), (cons, prod, back)]
        if len(cons.space) > len(prod.space):
            options.reverse()
        for host, small, partial in options:
            phi = self.embed(host, small, partial)
            if phi is None or not self.allowed(host, small, phi) \
                    or self.repeats_stores(host, small, phi):
                continue
            if self.creates_cycle(cons, prod):
                return False
            small.remap(phi)
            host.reduce = host.reduce | small.reduce
            host.vdims.update(small.vdims)
            host.odims.update(small.odims)
            host.core = host.core or small.core
            host.origin = host.origin or small.origin
            for forward in (True, False):
                self.join_links(host, small, forward)
            self.join_inputs(host, small)
            host.ops += small.ops
            for op in small.ops:
                self.group[op] = host
            small.ops = []
            return True
        return False

    def repeats_stores(self, host: Group, small: Group, phi: dict[int, int]) -> bool:
        """Whether small's ops would run at every point of host dims they do not vary
        along (dims host does not reduce: after a reduction, ops on the reduced value run
        once per row) while a value of theirs is read outside the two: its store, and the
        ops computing it, would repeat at each of those points. An optimizer's update of
        every bias joined an embedding's by the step-count scalars they share: 65 times
        the work and the stores (a data-parallel GPT-2-small update graph took 207 ms for
        149; 16-mixed's fused step 2.13 s for 1.98)."""
        image = set(phi.values())
        if all(size == 1 or d in image or d in host.reduce
               for d, size in enumerate(host.space)):
            return False
        return any(self.group.get(u) not in (host, small)
                   for op in small.ops for r in op.results for u, _ in r.uses)

    def only_adds_a_result(self, cons: Group, prod: Group) -> bool:
        """Whether a lone elementwise op joining a GEMM's epilogue would only give the
        kernel one more result to store: a reduction reads it (so a kernel after the
        epilogue needs it), what it reads from the kernel is stored anyway (each value is
        also read where an epilogue cannot go), and every reader of it can compute it on
        read instead. (An activation whose chain feeds the next GEMM stays: stored once
        either way, its input is in registers there.) A layer norm's backward then reads
        dy and gamma rather than three products of them that the GEMM before it stored
        (GPT B: 0.97x the step's time). Not on a recomputed graph, whose backward
        kernels follow the forward's and repeat layer after layer (an op moved to its
        readers there made kernels as deep as the model)."""
        if self.recomputed or prod.core is None or cons.core is not None or cons.reduce \
                or len(cons.ops) != 1 or cons.ops[0].name in VIEWS:
            return False
        (op,) = cons.ops
        readers = [u for u, _ in op.result.uses]
        inside = [v for v in op.operands if v in prod.vdims]
        return bool(inside) and any(u.name in REDUCTIONS for u in readers) \
            and all(self.fusible(u) and u.name not in CORES for u in readers) \
            and all(map(self.stored_anyway, inside))

    def stored_anyway(self, v: Value) -> bool:
        """Whether v is read where no epilogue can go: by a reduction, a GEMM, an op of
        the other phase (forward / backward) or an op no kernel fuses (the return)."""
        return any(u.name in REDUCTIONS or u.name in CORES or not self.fusible(u)
                   or self.in_backward(u) != self.in_backward(producer(v)) for u, _ in v.uses)

    def description(self, op: Operation) -> Description | None:
        """`describe(op)`, computed once: `fusible` asks about readers before they start
        groups of their own."""
        if op not in self.descriptions:
            self.descriptions[op] = describe(op)
        return self.descriptions[op]

    def fusible(self, op: Operation) -> bool:
        return self.description(op) is not None

    def in_backward(self, op: Operation) -> bool:
        """The phase a group of op runs in (`Group.backward`)."""
        return op not in self.forward or bool(op.attributes.get(RECOMPUTE))

    def join_links(self, host: Group, small: Group, forward: bool) -> None:
        """host's users (forward) or producers become those of host and small together,
        built on the group with more members, so each op's links move O(log ops) times."""
        name = "users" if forward else "producers"
        keep, other = (host, small) if len(host.ops) >= len(small.ops) else (small, host)
        links = getattr(keep, name)
        for op in other.ops:
            links.pop(op, None)
        links.update((u, None) for u in getattr(other, name) if self.group.get(u) is not keep)
        setattr(host, name, links)
        setattr(small, name, {})

    @staticmethod
    def join_inputs(host: Group, small: Group) -> None:
        """host's input heap becomes both groups' (the smaller pushed into the larger)."""
        big, little = sorted((host.inputs, small.inputs), key=len, reverse=True)
        for e in little:
            heapq.heappush(big, e)
        host.inputs, small.inputs = big, []
        host.end = max(host.end, small.end)

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
        if host.core is not None or small.core is not None:
            if not self.epilogues or host.core is None or red or host.reduce:
                return False
            if host.core.name in CONVS and not (self.conv_epilogues and _in_order(phi)):
                return False
        return True


def _in_order(phi: dict[int, int]) -> bool:
    """Whether a dim map keeps the dims' order: an epilogue that writes a conv's value
    transposed (into channels last: passes/layout.py) would store each unit scattered
    (MobileNetV2's stem 0.29 -> 0.53 ms); a kernel of its own transposes it instead."""
    return [phi[d] for d in sorted(phi)] == sorted(phi.values())
