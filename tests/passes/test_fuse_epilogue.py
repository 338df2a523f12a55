"""A Linear on [B, T, C] (decomposed as a matmul of x flattened to [B*T, C], its product
reshaped back) fuses like one on [B*T, C]: bias, activation and residual are the GEMM's
epilogue, forward and backward, with the values of the unfused graph (interpreter); the
flat product stays readable by other readers; the cpu backend runs each such matmul as
one GEMM with M = B*T."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import build

from ember.backends import cpu, interpreter
from ember.backends.cpu.gemm.matmul import plan_matmul
from ember.backends.cpu.machine.host import host_isa
from ember.ir import verify
from ember.ir.parser import parse
from ember.passes import PassManager, parse_pipeline

GRAD = "decompose,autodiff,canonicalize,cse,dce"


def run_pipeline(graph, pipeline: str):
    return verify(PassManager(parse_pipeline(pipeline), verify_each=True).run(
        parse(str(graph))))


def mlp(b, x, w1, b1, w2, b2):
    """x + fc2(tanh(fc1(x))): a transformer's MLP with its residual."""
    h = b.op("ember.tanh", b.op("nn.linear", x, w1, b1))
    return b.op("ember.add", x, b.op("nn.linear", h, w2, b2))


def args(lead, c=4, hidden=6, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=s) for s in ((*lead, c), (c, hidden), (hidden,), (hidden, c), (c,))]


def kernels(g) -> list[tuple[str, list[str]]]:
    """Each kernel op with the scalar ops of its body."""
    return [(op.name, [o.name for o in op.regions[0].blocks[0].ops])
            for op in g.ops if op.name.startswith("kernel.")]


def agree(fused, unfused, inputs, params, rtol=1e-10):
    want = interpreter.run(unfused, inputs, params)
    got = interpreter.run(fused, inputs, params)
    assert len(got) == len(want)
    for k, (x, y) in enumerate(zip(got, want)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol, err_msg=f"output {k}")


def step(lead, pipeline: str = GRAD):
    """(fused, unfused, inputs, params) of the MLP's training graph on x of shape lead+[C]."""
    a = args(lead)
    g = build(mlp, a, {1, 2, 3, 4})
    params = {f"p{i}": a[i] for i in (1, 2, 3, 4)}
    return run_pipeline(g, pipeline + ",fuse"), run_pipeline(g, pipeline), [a[0]], params


@pytest.mark.parametrize("lead", [(2, 3), (2, 1, 3), (2, 3, 5)])
def test_linear_on_nd_input_fuses_like_on_rows(lead):
    """The same kernels with the same bodies as the Linear on [B*T, C]: no elementwise
    kernel re-reads a product, and no reshape of one is left."""
    fused, unfused, inputs, params = step(lead)
    agree(fused, unfused, inputs, params)
    rows, _, _, _ = step((int(np.prod(lead)),))
    assert kernels(fused) == kernels(rows)
    products = {r for op in fused.ops if op.name == "kernel.matmul" for r in op.results}
    assert not [op for op in fused.ops if op.name == "ember.reshape"
                and op.operands[0] in products]
    fc1 = next(op for op in fused.ops if op.name == "kernel.matmul")
    assert {"kernel.add", "kernel.tanh"} <= {o.name for o in fc1.regions[0].blocks[0].ops}
    assert fc1.attributes["space"][:-3] == [d for d in lead[:-1]]


def test_flat_product_keeps_its_other_readers():
    """A reader of the flat [B*T, N] product besides the reshape (here a column sum and the
    graph's result) reads a view of the unflattened one; values unchanged."""
    def fn(b, x, w, bias):
        flat = b.op("ember.matmul", b.op("ember.reshape", x, shape=[6, 4]), w)
        y = b.op("ember.relu", b.op("ember.add", b.op("ember.reshape", flat, shape=[2, 3, 5]),
                                    bias))
        col = b.op("ember.reduce_sum", flat, axes=[0], keepdims=False)
        return b.op("ember.add", b.op("ember.reduce_sum", y, axes=[0], keepdims=False), col)

    rng = np.random.default_rng(1)
    a = [rng.normal(size=s) for s in ((2, 3, 4), (4, 5), (5,))]
    g = build(fn, a, {1, 2})
    params = {"p1": a[1], "p2": a[2]}
    fused, unfused = run_pipeline(g, "fuse"), run_pipeline(g, "canonicalize")
    agree(fused, unfused, [a[0]], params)
    (mm,) = [op for op in fused.ops if op.name == "kernel.matmul"]
    assert mm.attributes["space"] == [2, 3, 5, 4]
    assert "kernel.relu" in [o.name for o in mm.regions[0].blocks[0].ops]


@pytest.mark.parametrize("strategy", ["balanced", "all"])
def test_recomputing_linear_on_nd_input(strategy):
    """Recomputed copies keep their mark through the rewrite: forward and backward still
    never share a kernel, and the values are the unfused graph's."""
    fused, unfused, inputs, params = step(
        (2, 3), f"decompose,autodiff,recompute{{strategy={strategy}}},canonicalize,cse,dce")
    agree(fused, unfused, inputs, params)
    assert any(op.name == "kernel.matmul" and "kernel.tanh" in
               [o.name for o in op.regions[0].blocks[0].ops] for op in fused.ops)


def test_cpu_runs_each_nd_linear_as_one_gemm():
    """Every GEMM of the fused training graph on [2, 3, 5, C] has M = 30 rows or is a
    weight gradient (K = 30): the batch dims fold into M, none is looped over."""
    fused, unfused, inputs, params = step((2, 3, 5))
    want = interpreter.run(unfused, inputs, params)
    got = cpu.Executable(fused, 2, use_cache=False)(inputs, params)
    for x, y in zip(got, want):
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-9)
    mms = [op for op in fused.ops if op.name == "kernel.matmul"]
    plans = [plan_matmul(op, host_isa(), 2) for op in mms]
    assert all(not p.batch for p in plans)
    assert all(p.problem.m == 30 or p.problem.k == 30 for p in plans)
    assert sum(len(op.attributes["space"]) > 3 for op in mms) == 3  # fc1, fc2, fc2's dx


def test_cpu_keeps_looping_over_a_batch_that_b_varies_along():
    """A batched matmul whose B differs per batch element is not folded."""
    def fn(b, x, y):
        return b.op("ember.sigmoid", b.op("ember.matmul", x, y))

    rng = np.random.default_rng(2)
    a = [rng.normal(size=s) for s in ((3, 5, 7), (3, 7, 4))]
    g = build(fn, a, set())
    fused = run_pipeline(g, "fuse")
    (mm,) = [op for op in fused.ops if op.name == "kernel.matmul"]
    plan = plan_matmul(mm, host_isa(), 1)
    assert plan.batch == [3] and plan.problem.m == 5
    np.testing.assert_allclose(cpu.Executable(fused, 1, use_cache=False)(a)[0],
                               interpreter.run(g, a)[0], rtol=1e-9)


def test_a_product_that_only_a_reduction_reads_is_taken_there_not_stored():
    """dy = x W is stored anyway (its column sum, a bias gradient, reads it), so dy * g,
    which only a row sum reads (a layer norm's backward), runs in the row sum's kernel
    instead of giving the GEMM a second result; tanh(dy), which the next GEMM reads,
    stays in the epilogue (it is stored either way, and dy is in registers there)."""
    def fn(b, x, w, g, w2):
        dy = b.op("ember.matmul", x, w)
        col = b.op("ember.reduce_sum", dy, axes=[0], keepdims=False)
        rows = b.op("ember.reduce_sum", b.op("ember.mul", dy, g), axes=[1], keepdims=True)
        nxt = b.op("ember.matmul", b.op("ember.tanh", dy), w2)
        return b.op("ember.add", b.op("ember.add", b.op("ember.reduce_sum", col, axes=[0],
                                                        keepdims=False),
                                      b.op("ember.reduce_sum", rows, axes=[0, 1],
                                           keepdims=False)),
                    b.op("ember.reduce_sum", nxt, axes=[0, 1], keepdims=False))

    rng = np.random.default_rng(2)
    a = [rng.normal(size=s) for s in ((6, 4), (4, 5), (5,), (5, 3))]
    g = build(fn, a, {1, 2, 3})
    params = {f"p{i}": a[i] for i in (1, 2, 3)}
    fused, unfused = run_pipeline(g, "fuse"), run_pipeline(g, "canonicalize")
    agree(fused, unfused, [a[0]], params)
    first = next(op for op in fused.ops if op.name == "kernel.matmul")
    assert [o.name for o in first.regions[0].blocks[0].ops] == ["kernel.tanh", "kernel.yield"]
    assert len(first.results) == 2  # dy and tanh(dy): no dy * g
    (row_sum,) = [op for op in fused.ops if op.name == "kernel.fused" and "kernel.mul" in
                  [o.name for o in op.regions[0].blocks[0].ops]
                  and first.results[0] in op.operands]
    assert any(o.name == "kernel.reduce" and o.attributes["dims"] == [1]
               for o in row_sum.regions[0].blocks[0].ops)
