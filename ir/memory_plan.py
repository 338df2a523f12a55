"""Memory planning: liveness over an op order, buffer reuse, one static arena.

`plan_memory(graph) -> MemoryPlan` plans every op result that the graph computes (params,
constants and graph arguments are resident: the runtime owns them). A result lives from
its op to its last use (results returned by the graph: to the end). A reshape is a view:
its result shares its operand's buffer, which lives as long as either. Buffers are reused
in place: an op whose operand of the same shape and dtype dies there writes its result
into that operand's buffer where `in_place_operands` allows it (an elementwise op, a
single-output `kernel.fused` reading it at the index it writes); a result the graph
returns never does, and lives from the first step (a backend hands the caller a buffer
that it holds through the whole run, outside the arena). Buffers then get offsets in one
arena, greedily by size (largest first, lowest offset that no buffer alive at the same
time overlaps), 64-byte aligned (a backend may ask for more: the cuda one aligns to 256).

The plan's report breaks the peak down by class: `params`, `optimizer_state` (the state
arguments the optimizer pass adds, `ember.state`), `inputs` (every other argument),
`constants`, `saved` (forward values that live into the backward part: what
checkpointing keeps), `scratch` (kernels' working memory alive at the peak) and
`temporaries` (the rest of the arena at the peak), so that params + optimizer_state +
inputs + constants + saved + scratch + temporaries == peak_bytes (the whole saved set is
alive where the backward starts, so whenever the forward ops come first, as `recompute`
orders them, the peak holds it).

Kernel scratch (packed GEMM panels, conv and attention tiles) is the backend's to size:
`plan_memory(graph, scratch)` takes its `scratch(op) -> bytes` and plans each op's scratch
as one more buffer of the op's step, alive only there, as the backend places it.

It lives in the IR layer, not among the passes, because backends place their buffers
with it too (`plan` over steps of their own, with `Step.reuse` saying where a kernel
can really write over an operand); the `plan-memory` pass is passes/memory.py.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .core import Graph, Operation, Value
from .opdef import has_trait
from .types import TensorType

ALIGN = 64
RESIDENT_OPS = {"ember.param": "params", "ember.constant": "constants"}
VIEW_OPS = frozenset({"ember.reshape"})  # the result is its operand's bytes, reinterpreted
CLASSES = ("params", "optimizer_state", "inputs", "constants", "saved", "scratch",
           "temporaries")


def nbytes(key: Any) -> int:
    """The bytes of a planner key: anything with a `.type` (a Value, a Scratch, a backend's
    own key); 0 unless that type is a tensor type."""
    t = key.type
    return t.nbytes if isinstance(t, TensorType) else 0


def _aligned(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


# --- graph roles -------------------------------------------------------------------------

def backward_result_count(graph: Graph) -> int:
    """How many trailing results are not forward results (gradients, or new params and
    optimizer state after the optimizer pass)."""
    a = graph.attributes
    if "ember.updates" in a:
        return len(a["ember.updates"]) + len(a.get("ember.state", []))
    return len(a.get("ember.grads", []))


def forward_ops(graph: Graph) -> set[Operation]:
    """The forward part: ops the forward results (loss, outputs, buffer updates) depend on."""
    outs = graph.outputs
    todo = [v.op for v in outs[:len(outs) - backward_result_count(graph)] if v.op is not None]
    seen: set[Operation] = set()
    while todo:
        op = todo.pop()
        if op not in seen:
            seen.add(op)
            todo.extend(v.op for v in op.operands if v.op is not None)
    return seen


def argument_classes(graph: Graph) -> dict[Value, str]:
    n_state = len(graph.attributes.get("ember.state", []))
    args = graph.args
    return {v: "optimizer_state" if i >= len(args) - n_state else "inputs"
            for i, v in enumerate(args)}


# --- the plan ----------------------------------------------------------------------------

@dataclass
class Step:
    """One op of a schedule, with keys (anything with a `.type`) for its values.
    `reuse`: the operands its result may be written over (dying there, same type); None
    means what `in_place_operands` allows for an op of that name without regions (all
    operands of an elementwise op). `view`: the result is operand 0's buffer."""

    name: str
    operands: list[Any]
    results: list[Any]
    forward: bool = False
    reuse: list[Any] | None = None
    view: bool = False


@dataclass
class Buffer:
    size: int
    start: int
    end: int
    values: list[Any] = field(default_factory=list)
    offset: int = 0


@dataclass
class MemoryPlan:
    """Where every planned value lives (`offsets`, bytes into one arena of `arena_bytes`),
    which results were written in place over an operand (`in_place`: result -> operand),
    and the peak broken down by class (`report()`)."""

    offsets: dict[Hashable, int]
    in_place: dict[Hashable, Hashable]
    buffers: list[Buffer]
    peak_bytes: int
    peak_step: int
    arena_bytes: int
    classes: dict[str, int]
    saved: list[Hashable]

    def report(self) -> dict[str, int]:
        return {"peak_bytes": self.peak_bytes, "arena_bytes": self.arena_bytes,
                **self.classes, "saved_values": len(self.saved)}

    def __str__(self) -> str:
        r = self.report()
        width = max(len(k) for k in r)
        return "\n".join(f"{k:<{width}}  {v:>14,}" for k, v in r.items())


def plan(steps: list[Step], resident: dict[Hashable, str], outputs: Iterable[Hashable],
         align: int = ALIGN, place: bool = True) -> MemoryPlan:
    """Plan `steps` (in order); `resident` values (args, params, constants) are not in the
    arena; `outputs` live to the end. Every buffer starts on an `align`-byte boundary.
    `place=False` skips the offsets (none, arena 0): the peak does not depend on them, and
    a search over schedules (the recompute pass) wants only the peak."""
    end = len(steps)
    define: dict[Hashable, int] = {}
    last: dict[Hashable, int] = {}
    forward_defined: set[Hashable] = set()
    saved: dict[Hashable, None] = {}
    for t, s in enumerate(steps):
        for v in s.operands:
            last[v] = t
            if not s.forward and v in forward_defined:
                saved[v] = None
        for r in s.results:
            if r in resident:
                continue
            define[r] = t
            last.setdefault(r, t)
            if s.forward:
                forward_defined.add(r)
    returned = {v for v in outputs if v in define}
    for v in returned:
        last[v] = end

    buffer_of: dict[Hashable, Buffer] = {}
    buffers: list[Buffer] = []
    in_place: dict[Hashable, Hashable] = {}
    for t, s in enumerate(steps):
        claimed: set[int] = set()
        for r in s.results:
            if r not in define:
                continue
            if s.view and s.operands[0] in buffer_of:
                buf = buffer_of[s.operands[0]]
                buf.values.append(r)
                buf.end = max(buf.end, last[r])
                buffer_of[r] = buf
                continue
            donor = (_donor(s, r, t, last, buffer_of, claimed)
                     if len(s.results) == 1 and r not in returned else None)
            if donor is not None:
                buf = buffer_of[donor]
                claimed.add(id(buf))
                in_place[r] = donor
            else:
                # a returned result is the caller's buffer, held through the whole run
                buf = Buffer(_aligned(nbytes(r), align), 0 if r in returned else t, t)
                buffers.append(buf)
            buf.values.append(r)
            buf.end = max(buf.end, last[r])
            buffer_of[r] = buf

    # live arena bytes at every step, by class
    delta = [0] * (end + 2)
    for b in buffers:
        delta[b.start] += b.size
        delta[b.end + 1] -= b.size
    live, peak, peak_step = 0, 0, 0
    for t in range(end + 1):
        live += delta[t]
        if live > peak:
            peak, peak_step = live, t
    saved_bytes = sum(nbytes(v) for v in saved)
    res = {c: 0 for c in CLASSES}
    for v, c in resident.items():
        res[c] += nbytes(v)
    res["saved"] = saved_bytes
    res["scratch"] = sum(b.size for b in buffers if b.start <= peak_step <= b.end
                         and isinstance(b.values[0], Scratch))
    res["temporaries"] = max(0, peak - saved_bytes - res["scratch"])
    arena = _assign_offsets(buffers) if place else 0
    offsets = {v: b.offset for b in buffers for v in b.values} if place else {}
    total = sum(res[c] for c in ("params", "optimizer_state", "inputs", "constants"))
    return MemoryPlan(offsets, in_place, buffers, total + peak, peak_step, arena, res,
                      list(saved))


def _donor(s: Step, r: Any, t: int, last: dict[Hashable, int], buffer_of: dict[Hashable, Buffer],
           claimed: set[int]) -> Any:
    """An operand whose buffer `r` may overwrite: same type, dying at this step, its buffer
    not already taken by another result of the step nor read through a view by another
    operand (whose map `in_place_operands` did not compare)."""
    candidates = s.operands if s.reuse is None and has_trait(s.name, "elementwise") else (
        s.reuse or ())
    for v in candidates:
        buf = buffer_of.get(v)
        if buf is None or id(buf) in claimed or last.get(v) != t or buf.end != t:
            continue
        if any(u != v and buffer_of.get(u) is buf for u in s.operands):
            continue
        if v.type == r.type:
            return v
    return None


def in_place_operands(op: Operation, storage: Sequence[object]) -> list[int]:
    """The operands `op` may write its result over: those it reads at the very index it
    writes (and at no other), before writing it. That holds for an elementwise op's
    operands of the result's type, and for a single-output `kernel.fused` without
    reductions that reads the operand only through the result's own map, over a space of
    the result's size (each element written once). `storage[k]` names operand k's buffer:
    one buffer passed twice (x * x.T) must be read through that one map both times."""
    if op.name == "kernel.fused":
        a = op.attributes
        if len(op.results) != 1:
            return []
        t = op.result.type
        assert isinstance(t, TensorType)  # a kernel.fused result is a tensor (verified)
        if (math.prod(a["space"]) != t.size
                or any(b.name == "kernel.reduce" for b in op.regions[0].blocks[0].ops)):
            return []
        same = [k for k, m in enumerate(a["maps"]) if m == a["out_maps"][0] and all(
            a["maps"][j] == m for j, s in enumerate(storage) if s == storage[k])]
    elif has_trait(op.name, "elementwise") and len(op.results) == 1:
        same = list(range(len(op.operands)))
    else:
        return []
    return [k for k in same if op.operands[k].type == op.result.type]


def overwritable_operands(op: Operation, result: int, storage: Sequence[object]) -> list[int]:
    """The operands `op` may write result `result` over (a buffer its caller donates: a
    training step's param or optimizer state, updated in place). An elementwise op or a
    one-result `kernel.fused`: `in_place_operands`. A `kernel.fused` of several results,
    or a `kernel.matmul`'s epilogue (over the product: a backend whose GEMM accumulates
    into that very result must refuse it): an operand read only through that result's
    map, over a space of the result's size, of the result's type, and one the result is
    computed from, so that each element is loaded before the result's store and the
    loaded value serves every other result."""
    if len(op.results) == 1 and op.name != "kernel.matmul":
        return in_place_operands(op, storage) if result == 0 else []
    if op.name not in ("kernel.fused", "kernel.matmul"):
        return []
    a = op.attributes
    t = op.results[result].type
    block = op.regions[0].blocks[0]
    assert isinstance(t, TensorType)  # a kernel op's result is a tensor (verified)
    matmul = op.name == "kernel.matmul"
    space = a["space"][:-1] if matmul else a["space"]
    if math.prod(space) != t.size or any(o.name == "kernel.reduce" for o in block.ops):
        return []
    first = 2 if matmul else 0  # a matmul's block arguments: the product, then operand 2...
    reads = {k + first - matmul for k in _arguments_reaching(block.ops[-1].operands[result])}
    out = a["out_maps"][result]
    return [k for k, m in enumerate(a["maps"])
            if k >= first and m == out and k in reads and op.operands[k].type == t
            and all(a["maps"][j] == m for j, s in enumerate(storage) if s == storage[k])]


def _arguments_reaching(v: Value) -> set[int]:
    """The block arguments (by index) that value `v` of a kernel body is computed from."""
    seen: set[int] = set()
    out: set[int] = set()
    stack = [v]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        producer = x.op
        if producer is None:
            out.add(x.index)
        else:
            stack.extend(producer.operands)
    return out


def _assign_offsets(buffers: list[Buffer]) -> int:
    """Greedy by size: each buffer at the lowest offset free during its whole lifetime."""
    timeline = _Timeline(max((b.end for b in buffers), default=0) + 1)
    blocks = _Blocks()
    arena = 0
    for b in sorted(buffers, key=lambda b: (-b.size, b.start)):
        b.offset = timeline.lowest_free(b.start, b.end, b.size)
        arena = max(arena, b.offset + b.size)
        if b.size:  # an empty range overlaps nothing
            top = b.offset + b.size
            base = blocks.base(b.start, b.end, b.offset)
            blocks.add(b.start, b.end, base, top)
            timeline.add(b.start, b.end, base, top)
    return arena


class _Blocks:
    """Solid blocks: bytes [base, top) taken at every step start..end. A buffer placed
    right on a block that lives through all the buffer's steps makes one block with it,
    from that block's base, and the timeline gets the block, not the buffer alone. The
    bytes taken at each step stay the same (so do the offsets found), but the saved
    activations of a deep forward, stacked one on the next, become one span instead of
    hundreds spread over the timeline's nodes, which `lowest_free` climbed one round at a
    time (quadratic on deep training graphs). Blocks ending at one address never share a
    step: each holds the byte below it."""

    def __init__(self) -> None:
        # top -> the blocks' starts, ends and bases, in step order
        self.at: dict[int, tuple[list[int], list[int], list[int]]] = {}

    def base(self, start: int, end: int, offset: int) -> int:
        """The base of the block ending at `offset` that lives through steps start..end,
        else `offset`."""
        starts, ends, bases = self.at.get(offset, ((), (), ()))
        i = bisect.bisect_right(starts, start) - 1
        return bases[i] if i >= 0 and ends[i] >= end else offset

    def add(self, start: int, end: int, base: int, top: int) -> None:
        starts, ends, bases = self.at.setdefault(top, ([], [], []))
        i = bisect.bisect_left(starts, start)
        starts.insert(i, start)
        ends.insert(i, end)
        bases.insert(i, base)


class _Spans:
    """Disjoint, sorted byte ranges [start, end): a union of taken ranges, merged."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, lo: int, hi: int) -> None:
        i = bisect.bisect_left(self.ends, lo)  # the first span ending at or after lo
        j = bisect.bisect_right(self.starts, hi)  # past the last span starting by hi
        if i < j:
            lo, hi = min(lo, self.starts[i]), max(hi, self.ends[j - 1])
        self.starts[i:j], self.ends[i:j] = [lo], [hi]

    def blocking(self, lo: int, hi: int) -> int | None:
        """The end of the last span overlapping [lo, hi), if any."""
        i = bisect.bisect_left(self.starts, hi) - 1
        return self.ends[i] if i >= 0 and self.ends[i] > lo else None


class _Timeline:
    """Taken byte ranges indexed by the steps they are taken at, so the lowest free
    offset over steps s..e costs O(log steps) unions, not a scan of every placed buffer.
    A segment tree over steps: `cover[n]` unites the ranges for which n is one of the
    nodes that exactly cover their steps, `below[n]` those with such a node in n's
    subtree. Steps s..e meet exactly the ranges in `below` of the nodes covering s..e
    and in `cover` of those nodes' ancestors."""

    def __init__(self, steps: int):
        self.size = 1 << max(0, steps - 1).bit_length()
        self.cover: defaultdict[int, _Spans] = defaultdict(_Spans)
        self.below: defaultdict[int, _Spans] = defaultdict(_Spans)

    def nodes(self, s: int, e: int) -> list[int]:
        """The nodes that exactly cover steps s..e."""
        out, lo, hi = [], s + self.size, e + self.size + 1
        while lo < hi:
            if lo & 1:
                out.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                out.append(hi)
            lo, hi = lo >> 1, hi >> 1
        return out

    @staticmethod
    def ancestors(nodes: list[int]) -> set[int]:
        up = set()
        for n in nodes:
            while n > 1 and n >> 1 not in up:
                n >>= 1
                up.add(n)
        return up

    def add(self, start: int, end: int, lo: int, hi: int) -> None:
        """Bytes [lo, hi) taken during steps start..end."""
        nodes = self.nodes(start, end)
        for n in nodes:
            self.cover[n].add(lo, hi)
        for n in {*nodes, *self.ancestors(nodes)}:
            self.below[n].add(lo, hi)

    def lowest_free(self, s: int, e: int, size: int) -> int:
        """The lowest offset where `size` bytes overlap no buffer alive during s..e."""
        nodes = self.nodes(s, e)
        spans = [self.below[n] for n in nodes if n in self.below]
        spans += [self.cover[n] for n in self.ancestors(nodes) if n in self.cover]
        offset, moved = 0, size > 0
        while moved:
            moved = False
            for sp in spans:
                end = sp.blocking(offset, offset + size)
                if end is not None:
                    offset, moved = end, True
        return offset


@dataclass(eq=False)
class Scratch:
    """The planner's key of a kernel's scratch buffer (a value of its own)."""

    type: TensorType

    @staticmethod
    def of(size: int) -> Scratch:
        return Scratch(TensorType((size,), "i1"))


def graph_steps(graph: Graph, scratch: Callable[[Operation], int] | None = None
                ) -> tuple[list[Step], dict[Hashable, str]]:
    """The graph's ops as steps (with `scratch(op)` bytes of scratch each), and its
    resident values by class."""
    fwd = forward_ops(graph)
    resident: dict[Hashable, str] = dict(argument_classes(graph).items())
    steps = []
    for op in graph.ops:
        if op.name == "func.return":
            continue
        if op.name in RESIDENT_OPS:
            resident.update({r: RESIDENT_OPS[op.name] for r in op.results})
        size = scratch(op) if scratch is not None else 0
        steps.append(op_step(op, list(op.operands),
                             list(op.results) + ([Scratch.of(size)] if size else []), op in fwd))
    return steps, resident


def op_step(op: Operation, operands: list[Any], results: list[Any], forward: bool) -> Step:
    """`op` as a step over the keys `operands` and `results`: a view, or writing over
    what `in_place_operands` allows."""
    if op.name in VIEW_OPS:
        return Step(op.name, operands, results, forward, [], view=True)
    return Step(op.name, operands, results, forward,
                [operands[k] for k in in_place_operands(op, operands)])


def plan_memory(graph: Graph, scratch: Callable[[Operation], int] | None = None,
                place: bool = True) -> MemoryPlan:
    """Plan the arena of `graph` in its current op order, with the backend's `scratch`
    bytes per op where given (`place`: see `plan`)."""
    steps, resident = graph_steps(graph, scratch)
    return plan(steps, resident, graph.outputs, place=place)
