"""Fused kernels: the `fuse` pass and the cpu backend's kernel.* codegen, differentially.

Random graphs (odd sizes, size-1 and broadcast dims, transposes, reductions over every
axis, matmuls with transposed operands) run four ways — interpreter unfused (the
reference), interpreter fused, cpu unfused, cpu fused — and must agree to 1e-5
relative. Every codegen variant is hit on purpose: vector tails, thread splits, column
and row reductions here; the GEMMs' (packed and direct, transposed operands, OpenBLAS,
epilogues) in test_cpu_fused_gemm.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from fused_checks import close, four_ways, fuse, graph, kernels, rand
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.backends import cpu, interpreter
from ember.backends.cpu.kernels import fused as cpu_fused
from ember.backends.cpu.kernels import fused_space
from ember.backends.cpu.parallel import outline as cpu_threads
from ember.ir import Builder, Graph, TensorType, Value, verify

UNARY = ("tanh", "neg", "abs", "relu", "sigmoid")


# -- random graphs ---------------------------------------------------------------------------

SIZES = st.sampled_from([1, 2, 3, 5, 7, 17])


@st.composite
def random_graph(draw):
    rank = draw(st.integers(1, 3))
    base = [draw(SIZES) for _ in range(rank)]
    n_in = draw(st.integers(1, 3))
    shapes = []
    for _ in range(n_in):  # each input: the base shape with some dims 1 or dropped
        s = [d if draw(st.booleans()) or d == 1 else 1 for d in base]
        s = s[draw(st.integers(0, rank - 1)):] if draw(st.booleans()) else s
        shapes.append(tuple(s))
    shapes[0] = tuple(base)
    g = Graph("random", [TensorType(s, "f32") for s in shapes])
    b = Builder(g.body)
    vals: list[Value] = list(g.args)
    for _ in range(draw(st.integers(1, 8))):
        x = draw(st.sampled_from(vals))
        kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "transpose",
                                     "matmul", "softmax"]))
        t = x.type
        if kind == "unary":
            v = b.op("ember." + draw(st.sampled_from(UNARY)), x)
        elif kind == "binary":
            y = draw(st.sampled_from(vals))
            try:
                v = b.op("ember." + draw(st.sampled_from(["add", "sub", "mul", "max"])), x, y)
            except ValueError:
                continue
        elif kind == "reduce" and t.rank:
            axes = sorted(draw(st.sets(st.integers(0, t.rank - 1), min_size=1)))
            v = b.op("ember." + draw(st.sampled_from(["reduce_sum", "reduce_max",
                                                      "reduce_mean"])),
                     x, axes=axes, keepdims=draw(st.booleans()))
        elif kind == "transpose" and t.rank >= 2:
            perm = draw(st.permutations(list(range(t.rank))))
            v = b.op("ember.transpose", x, perm=list(perm))
        elif kind == "matmul" and t.rank >= 2:
            other = draw(st.sampled_from([u for u in vals if u.type.rank == 2] or [x]))
            k = t.shape[-1]
            if other.type.rank == 2 and other.type.shape[1] == k:
                y = b.op("ember.transpose", other, perm=[1, 0])  # x @ other^T
            elif other.type.rank == 2 and other.type.shape[0] == k:
                y = other
            else:
                continue
            v = b.op("ember.matmul", x, y)
        elif kind == "softmax" and t.rank:
            ax = draw(st.integers(0, t.rank - 1))
            m = b.op("ember.reduce_max", x, axes=[ax], keepdims=True)
            e = b.op("ember.exp", b.op("ember.sub", x, m))
            v = b.op("ember.div", e, b.op("ember.reduce_sum", e, axes=[ax], keepdims=True))
        else:
            continue
        vals.append(v)
    outs = vals[len(g.args):][-draw(st.integers(1, 3)):] or [b.op("ember.neg", vals[0])]
    b.create("func.return", outs)
    return verify(g), [np.random.default_rng(draw(st.integers(0, 99))).uniform(
        -2, 2, s).astype(np.float32) for s in shapes]


@pytest.mark.slow
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graph())
def test_random_graphs_fused_unfused_interpreter(case):
    g, inputs = case
    four_ways(g, inputs)


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(random_graph())
def test_random_graphs_with_every_kernel_threaded_and_packed(monkeypatch, case):
    """The same, with every kernel split across 3 threads and every GEMM packed."""
    from ember.backends.cpu.gemm import emit as gemm

    monkeypatch.setenv("EMBER_GEMM", "own")
    monkeypatch.setattr(cpu_threads, "MIN_WORK", 1)
    for name in ("THREAD_FLOPS", "BLOCK_A_BYTES", "PACK_B_BYTES"):
        monkeypatch.setattr(gemm, name, 1)
    g, inputs = case
    four_ways(g, inputs, threads=3)


# -- what fuses ------------------------------------------------------------------------------

def test_elementwise_chain_is_one_kernel_with_vector_tail():
    # 1000 = 62 vectors of 16 + a tail of 8
    g = graph([(1000,), (1000,)], lambda b, x, y: [
        b.op("ember.tanh", b.op("ember.mul", b.op("ember.add", x, y), y))])
    f = four_ways(g, rand((1000,), (1000,)))
    assert kernels(f) == ["kernel.fused"]


def test_bias_relu_epilogue_and_transposed_operands():
    def fn(b, x, w, bias):
        h = b.op("ember.relu", b.op("ember.add", b.op("ember.matmul", x, w), bias))
        gw = b.op("ember.matmul", b.op("ember.transpose", x, perm=[1, 0]), h)  # A^T
        gx = b.op("ember.matmul", h, b.op("ember.transpose", w, perm=[1, 0]))  # B^T
        return [h, gw, gx]

    g = graph([(33, 20), (20, 19), (19,)], fn)
    f = four_ways(g, rand((33, 20), (20, 19), (19,)))
    assert kernels(f) == ["kernel.matmul"] * 3
    mm = f.ops[0] if f.ops[0].name == "kernel.matmul" else f.ops[1]
    assert [op.name for op in mm.regions[0].blocks[0].ops] == [
        "kernel.add", "kernel.relu", "kernel.yield"]


@pytest.mark.parametrize("axis", [0, 1])
def test_softmax_rows_and_columns_one_kernel(axis):
    def fn(b, x):
        m = b.op("ember.reduce_max", x, axes=[axis], keepdims=True)
        e = b.op("ember.exp", b.op("ember.sub", x, m))
        return [b.op("ember.div", e, b.op("ember.reduce_sum", e, axes=[axis], keepdims=True))]

    g = graph([(37, 23)], fn)
    f = four_ways(g, rand((37, 23)))
    assert kernels(f) == ["kernel.fused"]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_max_reductions_propagate_nan_wherever_it_is(dtype):
    """Row and column max keep numpy's NaN (a NaN in the first lane, mid-vector or in the
    scalar tail) and infinities; which zero a tie of -0.0 and +0.0 gives is left open, as
    numpy leaves it (reductions combine with `nsz`, which spares x86 the signed-zero
    blends)."""
    def fn(b, x):
        return [b.op("ember.reduce_max", x, axes=[axis], keepdims=False) for axis in (0, 1)]

    x = rand((40, 37))[0].astype({"f32": np.float32, "f64": np.float64}[dtype])
    x[0, 0] = x[1, 36] = x[2, 17] = x[35, 5] = np.nan
    x[3] = -np.inf
    x[4, 8] = np.inf
    x[5] = 0.0
    x[5, ::2] = -0.0
    g = graph([x.shape], fn, dtype)
    want = [np.max(x, axis=0), np.max(x, axis=1)]
    f = fuse(g)
    assert kernels(f) == ["kernel.fused", "kernel.fused"]
    for run in (g, f):  # exact: == compares -0.0 and +0.0 equal, NaN only to NaN
        for got, ref in zip(cpu.Executable(run, use_cache=False)([x]), want):
            np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("rows,n", [(64, 10), (40, 3), (16, 15), (100, 1), (15, 10),
                                    (20000, 3)])
def test_short_rows_reduce_across_vector_lanes(rows, n):
    """A row kernel over rows shorter than a vector (a classifier's cross-entropy: max,
    exp, sum, log, the label's column picked through kernel.index) runs with its rows in
    the vector lanes (fused_space.py `_rows_across_lanes`): the same values. Rows too many for
    the accumulators to fit the stack stay rows (split across threads)."""
    g = Graph("f", [TensorType((rows, n), "f32"), TensorType((rows,), "i64")])
    b = Builder(g.body)
    x, lab = g.args
    m = b.op("ember.reduce_max", x, axes=[1], keepdims=True)
    z = b.op("ember.sub", x, m)
    lse = b.op("ember.log", b.op("ember.reduce_sum", b.op("ember.exp", z), axes=[1],
                                 keepdims=True))
    hot = b.op("ember.one_hot", lab, num_classes=n, dtype="f32")
    picked = b.op("ember.reduce_sum", b.op("ember.mul", b.op("ember.sub", z, lse), hot),
                  axes=[1], keepdims=False)
    b.create("func.return", [picked, b.op("ember.sub", z, lse)])
    labels = np.random.default_rng(1).integers(0, n, rows)
    f = four_ways(verify(g), [rand((rows, n))[0] * 4, labels])
    assert kernels(f) == ["kernel.fused"]
    shape = cpu_fused.FusedEmitter(f.ops[0].regions[0].blocks[0], [rows, n],
                                   f.ops[0].attributes["maps"],
                                   f.ops[0].attributes["out_maps"], ["f32", "i64"],
                                   ["f32", "f32"], "k").shape
    if n > 1:  # (a single column normalizes to no reduction at all)
        across = n < fused_space.SHORT_ROW <= rows and rows * 3 * 8 <= fused_space.ACC_STACK_LIMIT
        assert (shape.space, shape.reduce) == (([n, rows], {0}) if across else
                                               ([rows, n], {1}))


@pytest.mark.parametrize("hw,c", [(56, 16), (7, 40), (3, 16), (9, 5)])
def test_a_channels_last_pool_reduces_down_columns(hw, c):
    """The mean over H and W of an [n, h, w, c] image (a squeeze-excite's pool after a
    channels-last conv), with a max beside it: each image's [c, h*w] reduction reads down
    the columns of its [h*w, c] rows, so it runs as a column kernel over [h*w, c]
    (fused_space.py `_columns_read_down`), vectorized across the channels, where c fills
    a vector; the same values either way."""
    shape = (2, hw, hw, c)
    def fn(b, x):  # (NCHW pools of the transposed image: the layout pass's form)
        nchw = b.op("ember.transpose", x, perm=[0, 3, 1, 2])
        return [b.op("ember.reduce_mean", nchw, axes=[2, 3], keepdims=True),
                b.op("ember.reduce_max", b.op("ember.relu", nchw), axes=[2, 3], keepdims=False)]
    g = graph([shape], fn)
    f = four_ways(g, rand(shape))
    columns = c >= fused_space.SHORT_ROW
    assert kernels(f)
    for op in f.ops:
        if op.name != "kernel.fused":
            continue
        got = cpu_fused.FusedEmitter(op.regions[0].blocks[0], op.attributes["space"],
                                     op.attributes["maps"], op.attributes["out_maps"],
                                     ["f32"], ["f32"] * len(op.results), "k").shape
        assert got.space == ([2, hw * hw, c] if columns else [2, c, hw * hw]), got
        assert got.reduce == {1 if columns else 2}


@pytest.mark.parametrize("hw", [64, 130, 16])
def test_batchnorm_statistics_run_by_channel_across_threads(hw, monkeypatch):
    """BatchNorm's training statistics and normalization over [n, c, h*w], reduced over n
    and h*w per channel: run with the channels outermost (fused_space.py
    fused_space.py `_reduced_dims_innermost`), a row kernel split across threads by channel, whose
    short rows (up to SHORT_INNER) accumulate in a slot per column; rows shorter than
    SLAB_ROW keep the column kernel, whose threads take shares of the channels. The same
    values either way."""
    monkeypatch.setattr(cpu_threads, "MIN_WORK", 1024)
    n, c = 5, 6

    def batchnorm(b, x, w):
        mean = b.op("ember.mul", b.op("ember.reduce_sum", x, axes=[0, 2], keepdims=True), w)
        d = b.op("ember.sub", x, mean)
        var = b.op("ember.reduce_sum", b.op("ember.mul", d, d), axes=[0, 2], keepdims=True)
        peak = b.op("ember.reduce_max", x, axes=[0, 2], keepdims=True)
        return [b.op("ember.relu", b.op("ember.mul", d, b.op("ember.add", var, peak)))]

    f = four_ways(graph([(n, c, hw), (1, c, 1)], batchnorm), rand((n, c, hw), (1, c, 1)), 2)
    (op,) = [op for op in f.ops if op.name == "kernel.fused"]
    shape = cpu_fused._emitter(op, "k").shape
    by_channel = hw >= fused_space.SLAB_ROW
    assert (shape.space, shape.reduce) == (([c, n, hw], {1, 2}) if by_channel else
                                           ([n, c, hw], {0, 2}))
    llvm_ir = cpu.Executable(f, 2, use_cache=False).llvm_ir
    assert (".columns.chunk" in llvm_ir) != by_channel and ".chunk" in llvm_ir


@pytest.mark.parametrize("limit,columns", [(1024, 1000), (None, 700_000)])
def test_column_accumulators_too_big_for_the_stack_live_in_scratch(limit, columns,
                                                                     monkeypatch):
    """A column reduction keeps one accumulator per column and reduction: past
    ACC_STACK_LIMIT they live in the kernel's scratch (700k columns x 2 reductions is
    11 MB, more than a thread's stack: it used to crash)."""
    if limit is not None:
        monkeypatch.setattr(cpu_fused, "ACC_STACK_LIMIT", limit)

    def fn(b, x):
        m = b.op("ember.reduce_max", x, axes=[0], keepdims=True)
        e = b.op("ember.exp", b.op("ember.sub", x, m))
        return [b.op("ember.reduce_sum", e, axes=[0], keepdims=True)]

    g = fuse(graph([(2, columns)], fn))
    exe = cpu.Executable(g, use_cache=False)
    assert exe.plan.scratch_bytes(g.ops[0]) == columns * 2 * 8
    x = rand((2, columns))[0]
    np.testing.assert_allclose(exe([x])[0], np.exp(x - x.max(0)).sum(0, keepdims=True),
                               rtol=1e-6)


@pytest.mark.parametrize("rows", [1001, 4096])
def test_threads_split_the_rows_of_a_column_reduction(rows, monkeypatch):
    """A bias gradient and its update (a sum and a max over a [rows, 37] gradient's rows,
    then elementwise with a [37] input): each thread reduces a share of the rows into
    column accumulators of its own, in the kernel's scratch, added up before the update.
    A kernel that also stores per row (x minus its column sums) splits its columns."""
    monkeypatch.setattr(cpu_threads, "MIN_WORK", 1024)
    cols = 37

    def update(b, g, p):
        s = b.op("ember.reduce_sum", g, axes=[0], keepdims=False)
        m = b.op("ember.reduce_max", g, axes=[0], keepdims=False)
        return [b.op("ember.sub", p, b.op("ember.mul", s, m)), s]

    def centered(b, g, p):
        return [b.op("ember.sub", g, b.op("ember.reduce_sum", g, axes=[0], keepdims=True))]

    for fn, split in ((update, True), (centered, False)):
        f = four_ways(graph([(rows, cols), (cols,)], fn), rand((rows, cols), (cols,)), 2)
        (op,) = [op for op in f.ops if op.name == "kernel.fused"]
        exe = cpu.Executable(f, 2, use_cache=False)
        assert (".rows.chunk" in exe.llvm_ir) == split
        assert (".columns.chunk" in exe.llvm_ir) != split
        assert exe.plan.scratch_bytes(op) == (2 * 2 * cols * 8 if split else 0)


def test_reductions_over_different_axes_are_cut():
    def fn(b, x):
        y = b.op("ember.tanh", x)
        return [b.op("ember.reduce_sum", y, axes=[0], keepdims=False),
                b.op("ember.reduce_sum", y, axes=[1], keepdims=False)]

    g = graph([(9, 13)], fn)
    f = four_ways(g, rand((9, 13)))
    assert kernels(f) == ["kernel.fused", "kernel.fused"]


def test_3d_column_reduction_with_inner_parallel_dims():
    def fn(b, x, y):
        s = b.op("ember.reduce_sum", b.op("ember.mul", x, y), axes=[1], keepdims=True)
        return [b.op("ember.sub", x, s), b.op("ember.reduce_max", x, axes=[0, 2],
                                               keepdims=False)]

    four_ways(graph([(3, 5, 19), (5, 1)], fn), rand((3, 5, 19), (5, 1)))


def test_an_elementwise_kernel_of_half_a_million_elements_is_split_across_threads():
    """At the default threshold an exp over a [4096, 128] activation (~0.2 ms on one core)
    goes to the thread pool, as a 1M-element one (1.9x faster on two threads) does; one
    over a [64, 128] batch (a few us, less than a hand-off) stays on the calling thread."""
    for shape, split in (((4096, 128), True), ((64, 128), False)):
        g = graph([shape], lambda b, x: [b.op("ember.exp", x)])
        exe = cpu.Executable(fuse(g), threads=2, use_cache=False)
        assert ("ember_parallel_for" in exe.llvm_ir) == split, shape
        close(exe(rand(shape)), interpreter.run(g, rand(shape)))


def test_thread_split_elementwise_and_reduction(monkeypatch):
    monkeypatch.setattr(cpu_threads, "MIN_WORK", 64)
    g = graph([(64, 50), (50,)], lambda b, x, y: [
        b.op("ember.exp", b.op("ember.add", x, y)),
        b.op("ember.reduce_sum", b.op("ember.mul", x, x), axes=[1], keepdims=False)])
    f = fuse(g)
    exe = cpu.Executable(f, threads=3, use_cache=False)
    assert "ember_parallel_for" in exe.llvm_ir  # the loop goes to the thread pool
    close(exe(rand((64, 50), (50,))), interpreter.run(g, rand((64, 50), (50,))))


def test_one_hot_and_integer_inputs_fuse():
    g = Graph("f", [TensorType((6, 4), "f32"), TensorType((6,), "i64")])
    b = Builder(g.body)
    x, lab = g.args
    hot = b.op("ember.one_hot", lab, num_classes=4, dtype="f32")
    b.create("func.return", [b.op("ember.reduce_sum", b.op("ember.mul", x, hot), axes=[1],
                                  keepdims=False)])
    four_ways(verify(g), [rand((6, 4))[0], np.array([0, 3, 1, 2, 3, 0])])


def test_kernel_that_fails_to_compile_names_the_op(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("no luck")

    monkeypatch.setattr(cpu_fused.FusedEmitter, "emit", boom)
    f = fuse(graph([(4,)], lambda b, x: [b.op("ember.exp", x)]))
    with pytest.raises(cpu.KernelCompileError, match=r"(?s)k0_fused.*kernel\.fused.*no luck"):
        cpu.Executable(f, use_cache=False)


def test_kernel_ops_verify_maps_and_bodies():
    """Maps that read or write out of bounds, results not fully written, and stores
    that drop a dim the value varies along are all rejected, naming the rule."""
    from ember.ir import Block, Operation, Region, ScalarType, VerifyError
    from ember.ir.dialects.kernel import check_kernel

    def kernel(space, maps, out_maps, out_types, reduce_dims=None):
        g = Graph("k", [TensorType((4, 3), "f32")])
        blk = Block([ScalarType("f32")])
        v = blk.args[0]
        if reduce_dims:
            v = blk.append(Operation("kernel.reduce", [v], [ScalarType("f32")],
                                     {"kind": "add", "dims": reduce_dims})).result
        blk.append(Operation("kernel.yield", [v], []))
        op = Operation("kernel.fused", list(g.args), out_types,
                       {"space": space, "maps": maps, "out_maps": out_maps,
                        "out_types": out_types}, [Region([blk])])
        g.body.append(op)
        g.body.append(Operation("func.return", op.results, []))
        return g, op

    ok, op = kernel([4, 3], [[3, 1]], [[1, 4]], [TensorType((3, 4), "f32")])  # a transpose
    verify(ok)
    check_kernel(op)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(interpreter.run(ok, [x])[0], x.T)
    np.testing.assert_array_equal(cpu.Executable(ok, use_cache=False)([x])[0], x.T)
    bad, _ = kernel([4, 4], [[3, 1]], [[4, 1]], [TensorType((4, 4), "f32")])
    with pytest.raises(VerifyError, match="reads past its 12 elements"):
        verify(bad)
    bad, _ = kernel([4, 3], [[3, 1]], [[2, 1]], [TensorType((4, 3), "f32")])
    with pytest.raises(VerifyError, match="does not write every element"):
        verify(bad)
    g, op = kernel([4, 3], [[3, 1]], [[1, 0]], [TensorType((4,), "f32")])
    # types and maps are fine, but the stored value varies along dim 1
    with pytest.raises(VerifyError, match="varies along space dim 1"):
        verify(g)
    g, op = kernel([4, 3], [[3, 1]], [[1, 0]], [TensorType((4,), "f32")], reduce_dims=[1])
    check_kernel(op)  # a row sum is uniform along dim 1
    np.testing.assert_allclose(cpu.Executable(g, use_cache=False)([x])[0], x.sum(1))


def test_fused_ir_goes_through_mlir_opt_and_back():
    import re
    import shutil
    import subprocess
    from pathlib import Path

    from ember.ir.parser import parse

    exe = shutil.which("mlir-opt") or shutil.which("mlir-opt-19") or next(
        (p for p in ["/usr/lib/llvm-19/bin/mlir-opt"] if Path(p).exists()), None)
    if exe is None:
        pytest.skip("mlir-opt not installed")
    src = Path(__file__).parents[1] / "filecheck" / "fuse-mlp.mlir"
    fused = fuse(parse(src.read_text()))
    text = str(fused)
    for flags in ([], ["--mlir-print-op-generic"]):
        out = subprocess.run([exe, "--allow-unregistered-dialect", *flags, "-"], input=text,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        back = str(parse(out.stdout))  # mlir-opt renames values (%arg0...): compare without
        assert re.sub(r"%[\w.$-]+", "%v", back) == re.sub(r"%[\w.$-]+", "%v", text)
