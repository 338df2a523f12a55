"""The memory planner: a graph run out of one arena at the planned offsets computes what
the interpreter computes (no live value is ever overwritten), in place where allowed, the
report's classes add up to the peak, and the offsets are those of greedy-by-size placement
as its definition reads (tested against a naive one on random lifetimes)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_graphs import mixed, mlp

from ember.backends import interpreter
from ember.backends.interpreter import evaluate
from ember.ir import Builder, Graph, TensorType, numpy_dtype
from ember.ir.memory_plan import (
    CLASSES,
    Buffer,
    MemoryPlan,
    Step,
    graph_steps,
    plan,
    plan_memory,
)
from ember.passes import PassManager, parse_pipeline

T = TensorType


def run_in_arena(graph: Graph, inputs, params=None) -> list[np.ndarray]:
    """Execute `graph` keeping every planned value only in the arena, at its offset."""
    plan = plan_memory(graph)
    arena = np.zeros(plan.arena_bytes, np.uint8)
    env = dict(zip(graph.args, [np.asarray(x, numpy_dtype(a.type.dtype))
                                for x, a in zip(inputs, graph.args)]))

    def read(v):
        if v not in plan.offsets:
            return env[v]
        n, off = v.type.nbytes, plan.offsets[v]
        return arena[off:off + n].view(numpy_dtype(v.type.dtype)).reshape(v.type.shape).copy()

    for op in graph.ops:
        if op.name == "func.return":
            return [read(v) for v in op.operands]
        for r, val in zip(op.results, evaluate(op, [read(v) for v in op.operands], params or {})):
            if r in plan.offsets:
                off = plan.offsets[r]
                arena[off:off + r.type.nbytes] = np.ascontiguousarray(val).view(np.uint8).ravel()
            else:
                env[r] = val
    raise AssertionError("no func.return")


def assert_disjoint(p: MemoryPlan) -> None:
    """Buffers alive at the same time never share bytes; all lie in the arena, aligned."""
    for b in p.buffers:
        assert b.offset % 64 == 0 and b.offset + b.size <= p.arena_bytes
        for c in p.buffers:
            if b is not c and b.start <= c.end and c.start <= b.end:
                assert b.offset + b.size <= c.offset or c.offset + c.size <= b.offset


def check_plan(graph: Graph, inputs, params=None):
    plan = plan_memory(graph)
    assert_disjoint(plan)
    want = interpreter.run(graph, inputs, params)
    for got, ref in zip(run_in_arena(graph, inputs, params), want):
        np.testing.assert_array_equal(got, ref)
    rep = plan.report()
    assert sum(rep[c] for c in CLASSES) >= rep["peak_bytes"]
    return plan


UNARY = ["ember.exp", "ember.tanh", "ember.neg", "ember.sigmoid"]


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_random_graphs_run_from_the_arena(data):
    g = Graph("f", [T((4, 3), "f32"), T((3,), "f32")])
    b = Builder(g.body)
    vals = list(g.args)
    for _ in range(data.draw(st.integers(1, 12))):
        kind = data.draw(st.sampled_from(["unary", "binary", "reduce", "reshape", "matmul"]))
        x = data.draw(st.sampled_from(vals))
        if kind == "unary":
            vals.append(b.op(data.draw(st.sampled_from(UNARY)), x))
        elif kind == "binary":
            y = data.draw(st.sampled_from(vals))
            try:
                vals.append(b.op(data.draw(st.sampled_from(["ember.add", "ember.mul"])), x, y))
            except ValueError:
                pass
        elif kind == "reduce" and x.type.rank:
            vals.append(b.op("ember.reduce_sum", x, axes=[0], keepdims=False))
        elif kind == "reshape":
            vals.append(b.op("ember.reshape", x, shape=[x.type.size]))
        elif kind == "matmul" and x.type.shape == (4, 3):
            vals.append(b.op("ember.matmul", x, b.op("ember.transpose", x, perm=[1, 0])))
    outs = data.draw(st.lists(st.sampled_from(vals), min_size=1, max_size=3))
    b.create("func.return", outs)
    rng = np.random.default_rng(0)
    check_plan(g, [rng.normal(size=(4, 3)), rng.normal(size=3)])


def test_in_place_only_where_the_operand_dies():
    g = Graph("f", [T((64,), "f32")])
    b = Builder(g.body)
    a = b.op("ember.exp", g.args[0])
    c = b.op("ember.tanh", a)  # a dies here: in place
    d = b.op("ember.neg", c)  # c is used again below: not in place
    e = b.op("ember.mul", d, c)  # both die here: over one of them
    f = b.op("ember.exp", e)  # returned: the caller's own buffer, held from the start
    b.create("func.return", [f])
    plan = check_plan(g, [np.linspace(-1, 1, 64)])
    assert plan.in_place[c] is a and d not in plan.in_place and plan.in_place[e] in (c, d)
    assert f not in plan.in_place and plan.arena_bytes == 3 * 256


def test_report_classes_of_a_training_step():
    g = PassManager(parse_pipeline("decompose,autodiff,recompute{strategy=balanced},"
                                   "optimizer{kind=adam},canonicalize,cse,dce")).run(
        mlp(2, 8, 4).graph)
    net = mlp(2, 8, 4)
    rep = plan_memory(g).report()
    params = sum(int(np.prod(s)) * 4 for s in net.shapes.values())
    assert rep["params"] == params and rep["optimizer_state"] == 2 * params
    assert rep["inputs"] == 4 * 8 * 4 + 4 * 8 + 4 + 4  # x, y, lr, step
    assert rep["saved"] > 0 and rep["peak_bytes"] == sum(rep[c] for c in CLASSES)
    values = net.values()
    rng = np.random.default_rng(3)
    inputs = [rng.normal(size=(4, 8)), np.array([1, 2, 3, 0]), np.float32(0.01), np.float32(1)]
    state = [np.zeros(a.type.shape, np.float32) for a in g.args[4:]]
    check_plan(g, inputs + state, values)


def test_the_peak_without_placing_is_the_peak():
    """`place=False` (what a search over schedules asks for) gives the same peak and
    classes, and no offsets."""
    g = PassManager(parse_pipeline("decompose,autodiff,optimizer{kind=adam},fuse")).run(
        mlp(3, 16, 8).graph)
    steps, resident = graph_steps(g)
    placed, peak_only = plan(steps, resident, g.outputs), plan(steps, resident, g.outputs,
                                                                place=False)
    assert peak_only.report() == {**placed.report(), "arena_bytes": 0}
    assert placed.offsets and not peak_only.offsets


@pytest.mark.parametrize("strategy", ["none", "all"])
def test_mixed_model_runs_from_the_arena(strategy):
    net = mixed()
    g = PassManager(parse_pipeline(f"decompose,autodiff,recompute{{strategy={strategy}}}")
                    ).run(net.graph)
    rng = np.random.default_rng(0)
    check_plan(g, [rng.normal(size=(4, 3, 8, 8)), np.array([0, 1, 2, 3]), np.array(1)],
               net.values())


def test_plan_memory_pass_records_the_numbers():
    g = PassManager(parse_pipeline("decompose,autodiff,plan-memory")).run(mlp(2, 8, 4).graph)
    plan = plan_memory(g)
    assert g.attributes["ember.peak_bytes"] == plan.peak_bytes
    assert g.attributes["ember.arena_bytes"] == plan.arena_bytes
    assert "peak_bytes" in str(plan)


# --- offsets: greedy by size, against its naive definition ---------------------------------

class Key:
    """A planned value of a synthetic schedule: only its type matters."""

    def __init__(self, elems: int):
        self.type = T((elems,), "f32")


def schedule(lifetimes: list[tuple[int, int, int]]) -> list[Step]:
    """Steps where value i is made at step start_i and last read at end_i, never in place."""
    keys = [Key(n) for _, _, n in lifetimes]
    steps = [Step("test.op", [], [], reuse=[]) for _ in range(max(e for _, e, _ in lifetimes) + 1)]
    for k, (s, e, _) in zip(keys, lifetimes):
        steps[s].results.append(k)
        if e > s:
            steps[e].operands.append(k)
    return steps


def naive_offsets(buffers: list[Buffer]) -> list[int]:
    """Largest first (then earliest), each at the lowest offset that no buffer placed before
    it and alive at a common step overlaps: the lowest of 0 and those buffers' ends."""
    placed: list[tuple[Buffer, int]] = []
    offset = {}
    for b in sorted(buffers, key=lambda b: (-b.size, b.start)):
        near = [(c, o) for c, o in placed if c.size and c.start <= b.end and b.start <= c.end]
        offset[id(b)] = 0 if b.size == 0 else min(
            x for x in [0] + [o + c.size for c, o in near]
            if all(o + c.size <= x or x + b.size <= o for c, o in near))
        placed.append((b, offset[id(b)]))
    return [offset[id(b)] for b in buffers]


def check_offsets(lifetimes: list[tuple[int, int, int]]) -> MemoryPlan:
    p = plan(schedule(lifetimes), {}, ())
    assert_disjoint(p)
    assert [b.offset for b in p.buffers] == naive_offsets(p.buffers)
    assert p.arena_bytes >= p.peak_bytes  # no resident values: the peak is the most live
    return p


ELEMS = st.sampled_from([0, 1, 16, 17, 64, 100, 256])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30), ELEMS), min_size=1, max_size=40))
def test_offsets_are_greedy_by_size(raw):
    check_offsets([(s, s + n, size) for s, n, size in raw])


@pytest.mark.parametrize("sizes", [[256], [256, 128], [16, 256, 64]])
def test_a_stack_of_saved_activations(sizes):
    """Nested lifetimes, as a forward's saved values have, with short temporaries between:
    every saved value is alive mid-way, so the arena must (and does) hold them all."""
    n = 60
    saved = [(2 * i, 4 * n - 2 * i, sizes[i % len(sizes)]) for i in range(n)]
    temps = [(2 * i + 1, 2 * i + 2, 512) for i in range(n)]
    p = check_offsets(saved + temps)
    assert p.arena_bytes == p.peak_bytes
