"""`recompute{strategy=none|all|balanced|min-cut budget=BYTES segments=N}`: what the
backward keeps and what it recomputes.

Runs on the joint graph that autodiff returns (before the optimizer pass). The forward
part is every op the forward results (loss, outputs, buffer updates) depend on; the
backward part is the rest. The pass reorders the graph into the forward part, then the
backward part (a view it takes of forward values moved to its first reader), and chooses
the *saved set*: the forward values that stay alive into the
backward. Every other forward value the backward reads is recomputed there: its op (and,
recursively, whatever it needs that is not saved) is duplicated just before the first
backward op that reads it, marked `ember.recompute = true` (CSE never merges such a copy
back). Copies are shared, so a recomputed matmul or conv (or the q, k, v of an
attention) runs at most once per backward *segment* (see `_Scheduler`): the backward is
cut into `segments` runs of about equally many ops, never inside an attention's backward,
and a copy made in one is read by every later op of that run. A random op is copied with
its attributes and its rng operand, so a recomputed dropout draws exactly the mask the
forward drew. Graph arguments, params, constants and the forward results are always
available and never recomputed.

- `none`: save every forward value the backward reads.
- `all`: save nothing recomputable: the backward recomputes chains from the inputs. In
  1 segment that is the forward once, its copies alive about as long as `balanced` keeps
  the originals; in 2, segment 1 recomputes the whole forward and keeps what it needs,
  segment 2 the front half again (1.5 forwards, about half the memory); each segment
  more: less memory, one more partial forward. Unless `segments` is given, it takes the
  count with the lowest planned peak whose modelled step work (forward, backward and
  recompute) stays within STEP_CAP (1.4) times `none`'s: the step time is what the
  memory is traded for (a 4-block GPT: 1 segment, 1.1 forwards recomputed).
- `balanced`: save results of compute-bound ops (matmul, conv, linear, attention: the
  rule table's "compute" class) and recompute memory-bound chains from them, except the
  q, k and v of a fusible attention (`Joint.attention`), which are saved too: the
  fused attention backward needs them, and never stores the scores it recomputes.
- `min-cut`: the saved set is a minimum s-t cut (networkx max-flow) of a graph in which
  saving a value costs its bytes and recomputing an op costs its work: bytes first,
  recompute as the tie-break, compute-bound ops never recomputed. With `budget` (bytes,
  the planned peak of the joint graph, params and inputs included), it sweeps the
  bytes/recompute trade-off (then allows recomputing compute-bound ops, then recomputes
  everything, in 1, 2, 4, 8 and 16 segments) and takes the cheapest schedule whose planned
  peak fits; if none does, it fails naming the best achievable peak.

So no strategy's peak, as planned here (before `fuse`), exceeds `none`'s: a shared copy
lives from its recomputation (in the backward) to its last use in its segment, inside the
lifetime the original has under `none` (from the forward to its last backward use); a
cheap copy made only to recompute another lives a few ops. Fusion and the optimizer's
update can still turn that around (fusion shrinks a graph that keeps every activation
more than one that recomputes; the grads and optimizer state alive at the end of the
backward meet copies there), so the compile pipeline plans the finished graph of the
strategy and of its `fallback` and keeps the strategy only where it plans less
(runtime/pipeline.py, `Stages`).

The graph gets `ember.recompute_strategy = "<strategy>"`, `ember.saved = ["%N", ...]` (the saved
values as numbered in the dump right after this pass) and `ember.saved_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, NamedTuple

from ..ir import Graph, Operation, Value, has_trait
from ..ir.memory_plan import (
    RESIDENT_OPS,
    Step,
    argument_classes,
    forward_ops,
    nbytes,
    op_step,
    plan,
)
from .autodiff.rules import bound_class
from .canonicalize import Canonicalize
from .cse import Cse
from .dce import Dce
from .fuse.analysis import VIEWS
from .fuse.attention import match_probs, read_p
from .manager import Pass, PipelineError, register_pass
from .narrow import producer, tensor_type

STRATEGIES = ("none", "all", "balanced", "min-cut")
RECOMPUTE = "ember.recompute"
WINDOW = 2  # backward ops within which a cheap copy made to recompute another is shared
MAX_SEGMENTS = 8
STEP_CAP = 1.4  # modelled step work `all` may spend, relative to `none`'s, to plan less memory


class Clone:
    """A recomputed copy of a forward value, before the schedule is materialized."""

    __slots__ = ("of", "type")

    def __init__(self, of: Value):
        self.of, self.type = of, of.type


@dataclass
class ScheduledOp:
    op: Operation  # for a clone: the forward op it copies
    operands: list[Value | Clone]
    results: list[Value] | list[Clone]  # a clone's are Clones
    clone: bool = False
    forward: bool = False


@dataclass
class Schedule:
    entries: list[ScheduledOp]
    saved: dict[Value, None] = field(default_factory=dict)
    cost: int = 0  # work recomputed (see `work`)
    clones: int = 0

    def steps(self) -> list[Step]:
        return [op_step(e.op, e.operands, e.results, e.forward) for e in self.entries]


def recomputable(op: Operation) -> bool:
    return has_trait(op.name, "pure") and not op.regions and op.name not in RESIDENT_OPS


def compute_bound(op: Operation) -> bool:
    return bound_class(op.name) == "compute" or has_trait(op.name, "compute_bound")


def work(op: Operation) -> int:
    """A rough cost of recomputing `op`: result elements, times the contraction length of
    compute-bound ops."""
    n = max(1, sum(tensor_type(r).size for r in op.results))
    if not compute_bound(op) or len(op.operands) < 2:
        return n
    w = tensor_type(op.operands[1])
    if op.name in ("ember.conv2d", "nn.conv2d"):
        return n * max(1, w.size // max(1, w.shape[0]))
    return n * max(1, tensor_type(op.operands[0]).shape[-1])


def sink_views(backward: list[Operation], fwd: set[Operation]) -> list[Operation]:
    """The backward ops, each view of forward values (a transpose autodiff takes up front)
    moved to just before its first reader: it then reads the copy made in that reader's
    segment, not one that an earlier segment would keep alive for it."""
    early: set[Operation] = set()
    for op in backward:
        if op.name in VIEWS and all(v.op is None or v.op in fwd or v.op in early
                                    for v in op.operands):
            early.add(op)
    order: list[Operation] = []
    placed: set[Operation] = set()

    def place(op: Operation) -> None:
        for v in op.operands:
            if v.op in early and v.op not in placed:
                place(v.op)
        placed.add(op)
        order.append(op)

    for op in backward:
        if op not in early:
            place(op)
    for op in backward:  # a view nothing in the backward reads (a result): at the end
        if op not in placed:
            place(op)
    return order


class Attention(NamedTuple):
    """The attentions that `fuse` makes one kernel of (fuse/attention.py). Their fused
    backward recomputes p from q and k, so it forms only when it reads the very q, k, v
    values the softmax it replaces was computed from: one copy each, in one segment."""

    inputs: set[Operation]  # the forward ops whose results are their q, k and v
    spans: list[tuple[int, int]]  # per attention: first and last backward op reading them


class Joint:
    """The joint graph split into its forward and backward parts."""

    def __init__(self, graph: Graph):
        self.graph = graph
        fwd = forward_ops(graph)
        ops = [op for op in graph.ops if op.name != "func.return"]
        self.forward = [op for op in ops if op in fwd]
        self.backward = sink_views([op for op in ops if op not in fwd], fwd)
        self.fwd = fwd
        outs = graph.outputs
        self.results = set(outs[:len(outs) - len(graph.attributes["ember.grads"])])

    @cached_property
    def attention(self) -> Attention:
        """See `Attention`; a span is over the backward ops (by index) that read p, q, k, v
        or a view of them."""
        inputs: set[Operation] = set()
        spans = []
        at = {op: i for i, op in enumerate(self.backward)}
        for op in self.forward:
            pr = match_probs(op) if op.name == "ember.div" else None
            r = read_p(pr) if pr is not None else None
            if pr is None or r is None:
                continue
            bases = [b for b in (pr.q[0], pr.k[0], *(v[0] for _, v in r.forward))
                     if not self.free(b)]
            inputs.update(producer(b) for b in bases)  # not free: not an argument
            values: set[Value] = set()
            todo = [pr.p, *bases]
            while todo:  # and their views (a view the backward takes early reads nothing)
                v = todo.pop()
                values.add(v)
                todo += [u.result for u, _ in v.uses if u.name in VIEWS]
            readers = [at[u] for v in values for u, _ in v.uses
                       if u in at and u.name not in VIEWS]
            if readers:
                spans.append((min(readers), max(readers)))
        return Attention(inputs, spans)

    def segment_starts(self, segments: int) -> set[int]:
        """Where each segment of the backward after the first starts: `segments` runs of
        about equally many ops, a start moved past the backward of an attention it would
        cut (see `attention`)."""
        n, spans = len(self.backward), self.attention.spans
        starts = set()
        for k in range(1, segments):
            start = -(-k * n // segments)
            for lo, hi in sorted(spans):
                if lo < start <= hi:
                    start = hi + 1
            starts.add(start)
        return starts

    def free(self, v: Value) -> bool:
        """Available in the backward at no memory cost beyond what it costs anyway."""
        op = v.op
        return op is None or op not in self.fwd or op.name in RESIDENT_OPS or v in self.results

    def needed(self) -> list[Value]:
        """Forward values the backward reads that are not free."""
        seen: dict[Value, None] = {}
        for op in self.backward:
            seen.update((v, None) for v in op.operands if not self.free(v))
        return list(seen)

    def schedule(self, keep: Callable[[Operation], bool], segments: int = 1,
                 window: int = WINDOW) -> Schedule:
        """Forward ops, then backward ops with the copies they need just before them; a
        forward op is saved when `keep(op)` or when it cannot be recomputed (see
        `_Scheduler` for `segments` and `window`)."""
        return _Scheduler(self, keep, segments, window).run()

    def peak(self, s: Schedule) -> int:
        """The planned peak of schedule `s` (the offsets are not placed: not needed)."""
        resident: dict[Hashable, str] = {v: c for v, c in argument_classes(self.graph).items()}
        for e in s.entries:
            if e.op.name in RESIDENT_OPS:
                resident.update({r: RESIDENT_OPS[e.op.name] for r in e.results})
        return plan(s.steps(), resident, self.graph.outputs, place=False).peak_bytes

    def min_cut(self, alpha: int, allow_compute: bool) -> set[Operation]:
        """Forward ops to save: a minimum cut where saving op costs alpha * bytes and
        recomputing it costs `work(op)` (compute-bound ops: not at all, unless allowed)."""
        import networkx as nx  # only min-cut needs it (and it is slow to import)

        needed = self.needed()
        g = nx.DiGraph()
        relevant: set[Operation] = set()
        todo = [producer(v) for v in needed]  # not free: not arguments
        while todo:
            op = todo.pop()
            if op in relevant:
                continue
            relevant.add(op)
            todo.extend(producer(u) for u in op.operands if not self.free(u))
        for op in relevant:
            g.add_edge(("in", op), ("out", op), capacity=alpha * sum(map(nbytes, op.results)))
            banned = not recomputable(op) or (compute_bound(op) and not allow_compute)
            if banned:
                g.add_edge("source", ("in", op))  # no capacity: infinite
            else:
                g.add_edge("source", ("in", op), capacity=work(op))
            for u in op.operands:
                if not self.free(u):
                    g.add_edge(("out", u.op), ("in", op))
        for v in needed:
            g.add_edge(("out", v.op), "sink")
        if not needed:
            return set()
        _, (reach, _) = nx.minimum_cut(g, "source", "sink")
        return {op for op in relevant if ("in", op) in reach}

    def expensive(self, op: Operation) -> bool:
        """What `balanced` saves and `all` copies once per segment: a compute-bound op, or
        one whose result is an attention's q, k or v (see `Attention`)."""
        return compute_bound(op) or op in self.attention.inputs

    def total_work(self, ops: list[Operation] | None = None) -> int:
        """The `work` of `ops` (default: the forward), at least 1."""
        return sum(work(op) for op in (self.forward if ops is None else ops)) + 1


class _Scheduler:
    """Copies are shared within a segment of the backward (`Joint.segment_starts`), but
    cheap ones only while sharing keeps them short-lived. A value the backward reads
    directly, and a copy of a compute-bound op (matmul, conv) or of an attention's q, k
    or v (`Attention`), is copied once per segment and read by every later op of the
    segment: recomputing the chain behind it again for each reader is what made `all`
    quadratic in depth (a chain from the inputs per value read). A cheap copy (a
    memory-bound op) made only to recompute another is reused only within `window`
    backward ops of its last use; after that it is recomputed again, from the shared
    copies, so a long chain of elementwise ops recomputed early in the backward does not
    stay alive until its other readers. At a segment's start every copy is forgotten:
    what the segment needs again it recomputes, so no copy lives from one segment into
    the next."""

    def __init__(self, joint: Joint, keep: Callable[[Operation], bool], segments: int,
                 window: int):
        self.joint, self.keep, self.window = joint, keep, window
        self.segments = segments
        self.s = Schedule([ScheduledOp(op, list(op.operands), list(op.results), forward=True)
                           for op in joint.forward])
        self.memo: dict[Value, Clone] = {}
        self.scratch: dict[Value, tuple[Clone, int]] = {}  # value -> (copy, last use)
        self.now = 0

    def run(self) -> Schedule:
        starts = self.joint.segment_starts(self.segments)
        for now, bop in enumerate(self.joint.backward):
            if now in starts:
                self.memo.clear()
                self.scratch.clear()
            self.now = now
            operands = [self.get(v) for v in bop.operands]
            self.s.entries.append(ScheduledOp(bop, operands, list(bop.results)))
        return self.s

    def lookup(self, v: Value) -> Value | Clone | None:
        """What to read for `v` now (saving it if it is kept), or None: to be recomputed."""
        op, j = v.op, self.joint
        if op is None or op not in j.fwd or op.name in RESIDENT_OPS:
            return v
        if v in j.results or self.keep(op) or not recomputable(op):
            self.s.saved[v] = None
            return v
        if v in self.memo:
            return self.memo[v]
        copy, last = self.scratch.get(v, (None, -1))
        if copy is None or self.now - last > self.window:
            return None
        self.scratch[v] = (copy, self.now)
        return copy

    def get(self, v: Value) -> Value | Clone:
        found = self.lookup(v)
        if found is not None:
            if isinstance(found, Clone):
                self.memo[v] = found
            return found
        stack = [producer(v)]  # lookup gives None only for results of forward ops
        while stack:  # post-order over what is missing, without recursion
            op = stack[-1]
            if all(self.lookup(r) is not None for r in op.results):
                stack.pop()
                continue
            missing = [producer(u) for u in op.operands if self.lookup(u) is None]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            clones = [Clone(r) for r in op.results]
            operands = [_found(self.lookup(u)) for u in op.operands]
            self.s.entries.append(ScheduledOp(op, operands, clones, clone=True))
            self.s.cost += work(op)
            self.s.clones += 1
            if self.joint.expensive(op):
                self.memo.update(zip(op.results, clones))
            else:
                self.scratch.update((r, (c, self.now)) for r, c in zip(op.results, clones))
        if v not in self.memo:  # read directly: shared for the rest of the segment
            self.memo[v] = self.scratch[v][0]
        return self.memo[v]


def _found(v: Value | Clone | None) -> Value | Clone:
    """What `lookup` found for an operand of a copy made once none was missing."""
    assert v is not None
    return v


def materialize(graph: Graph, s: Schedule) -> None:
    """Rebuild the graph's op list as the schedule says."""
    made: dict[Value | Clone, Value] = {}  # each clone -> the result of its copy
    ops: list[Operation] = []
    for e in s.entries:
        operands = [made[k] if isinstance(k, Clone) else k for k in e.operands]
        if e.clone:
            op = Operation(e.op.name, operands, [r.type for r in e.op.results],
                           {**e.op.attributes, RECOMPUTE: True}, loc=e.op.loc)
            made.update(zip(e.results, op.results))
        else:
            op = e.op
            for i, v in enumerate(operands):
                if op.operands[i] is not v:
                    op.set_operand(i, v)
        op.parent = graph.body
        ops.append(op)
    graph.body.ops[:] = ops + [graph.return_op]


def value_names(graph: Graph) -> dict[Value, str]:
    """`%N` as the printer numbers results (args by name)."""
    names = {v: f"%{v.name or i}" for i, v in enumerate(graph.args)}
    n = 0
    for op in graph.walk():
        for r in op.results:
            names[r] = f"%{n}"
            n += 1
    return names


Best = tuple[int, int, Schedule] | None  # (cost, peak, schedule), see Recompute._min_cut
Lowest = tuple[int, str] | None  # (peak, how)


@register_pass
@dataclass(frozen=True)
class Recompute(Pass):
    name: ClassVar[str] = "recompute"
    STRATEGIES: ClassVar[tuple[str, ...]] = STRATEGIES
    strategy: str = "none"
    budget: int = 0
    segments: int = 0  # 0: 1, or for `all` the best within STEP_CAP

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise PipelineError(f"recompute: strategy={self.strategy!r} is not one of "
                                f"{', '.join(STRATEGIES)}")
        if self.budget < 0:
            raise PipelineError(f"recompute: budget must be a number of bytes >= 0, "
                                f"got {self.budget}")
        if self.segments < 0:
            raise PipelineError(f"recompute: segments must be >= 1 (or 0: the strategy's "
                                f"default), got {self.segments}")

    def check(self, graph: Graph) -> None:
        a = graph.attributes
        if "ember.updates" in a:
            raise PipelineError("recompute must run before optimizer: it splits the joint "
                                "forward+backward graph that autodiff returns, and the "
                                "update is neither")
        if "ember.grads" not in a:
            raise PipelineError("recompute needs the joint forward+backward graph: run "
                                "autodiff first (e.g. -p 'decompose,autodiff,recompute')")
        if "ember.recompute_strategy" in a:
            raise PipelineError(f"recompute: @{graph.name} has been through recompute already "
                                f"(strategy {a['ember.recompute_strategy']!r})")
        if any(op.regions for op in graph.ops):
            raise PipelineError("recompute must run before fuse: it recomputes single ops, "
                                "not fused kernels")

    def apply(self, graph: Graph) -> Graph:
        self.check(graph)
        for p in (Canonicalize(), Cse(), Dce()):  # decide on the ops that will really run
            graph = p.apply(graph)
        joint = Joint(graph)
        if self.strategy == "min-cut":
            s = self._min_cut(joint)
        else:
            if self.strategy == "all" and not self.segments:
                s = self._all(joint)
            else:
                keep = {"none": lambda op: True, "all": lambda op: False,
                        "balanced": joint.expensive}[self.strategy]
                s = joint.schedule(keep, self.segments or 1)
            if self.budget:
                peak = joint.peak(s)
                if peak > self.budget:
                    raise PipelineError(f"recompute: strategy {self.strategy} needs a planned "
                                        f"peak of {peak} bytes, over the budget of "
                                        f"{self.budget}; try strategy=min-cut")
        materialize(graph, s)
        names = value_names(graph)
        graph.attributes["ember.recompute_strategy"] = self.strategy
        graph.attributes["ember.saved"] = [names[v] for v in s.saved]
        graph.attributes["ember.saved_bytes"] = sum(map(nbytes, s.saved))
        return graph

    def _all(self, joint: Joint) -> Schedule:
        """The lowest planned peak over 1, 2, ... segments while the modelled step work
        (forward, backward and recompute, see `work`) stays within STEP_CAP times `none`'s
        (fewer segments on a tie)."""
        step = joint.total_work(joint.forward + joint.backward)
        best: tuple[int, Schedule] | None = None  # (peak, schedule)
        for n in range(1, MAX_SEGMENTS + 1):
            s = joint.schedule(lambda op: False, n)
            if best is not None and step + s.cost > STEP_CAP * step:
                break
            peak = joint.peak(s)
            if best is None or peak < best[0]:
                best = (peak, s)
        assert best is not None  # the first round, one segment, always sets it
        return best[1]

    def fallback(self) -> Recompute | None:
        """What the compile pipeline runs instead where this strategy's finished graph
        (fused, with the optimizer's update) plans no less memory than this one's: `none`
        for balanced and min-cut, `balanced` for all (itself checked against `none`). None
        for `none`, and under a budget (the budget's schedule is what was asked for)."""
        if self.strategy == "none" or self.budget:
            return None
        return Recompute("balanced" if self.strategy == "all" else "none")

    def _min_cut(self, joint: Joint) -> Schedule:
        top = joint.total_work()  # one byte outweighs all recomputation
        if not self.budget:
            keep = joint.min_cut(top, allow_compute=False)
            return joint.schedule(lambda op: op in keep, self.segments or 1)
        seen: set[frozenset[Operation]] = set()
        best: Best = None  # (cost, peak, schedule) of the cheapest that fits
        lowest: Lowest = None  # (peak, how) of the lowest peak found
        for allow in (False, True):
            for alpha in [top >> k for k in range(top.bit_length() + 1)]:
                cut = frozenset(joint.min_cut(alpha, allow))
                if cut in seen:
                    continue
                seen.add(cut)
                s = joint.schedule(cut.__contains__, self.segments or 1)
                best, lowest = self._consider(joint, s, best, lowest)
        for n in (1, 2, 4, 8, 16):  # then recompute everything, in more and more segments
            s = joint.schedule(lambda op: False, n)
            best, lowest = self._consider(joint, s, best, lowest)
        if best is None:
            assert lowest is not None  # every _consider sets it
            raise PipelineError(f"recompute: the memory budget of {self.budget} bytes cannot "
                                f"be met: the best achievable planned peak is {lowest[0]} "
                                f"bytes ({lowest[1]})")
        return best[2]

    def _consider(self, joint: Joint, s: Schedule, best: Best,
                  lowest: Lowest) -> tuple[Best, Lowest]:
        peak = joint.peak(s)
        if lowest is None or peak < lowest[0]:
            lowest = (peak, f"saving {len(s.saved)} values of {sum(map(nbytes, s.saved))} bytes"
                            f" and recomputing {s.clones} ops")
        if peak <= self.budget and (best is None or (s.cost, peak) < best[:2]):
            best = (s.cost, peak, s)
        return best, lowest
