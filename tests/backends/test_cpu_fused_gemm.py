"""Fused GEMMs (`kernel.matmul`) on the cpu, against the interpreter: the narrow product
computed swapped, packed and threaded GEMMs with edges, epilogues on each finished block of
rows, K split across threads, batches of small GEMMs, OpenBLAS with transposes and the
direct (unpacked) GEMM split across threads."""

from __future__ import annotations

import pytest
from fused_checks import close, four_ways, fuse, graph, kernels, rand

from ember.backends import cpu, interpreter


@pytest.mark.parametrize("engine", ["own", "blas"])
@pytest.mark.parametrize("m,n,k,epilogue", [(37, 10, 29, True), (512, 10, 128, True),
                                           (100, 1, 3, False), (31, 10, 29, True)])
def test_narrow_gemm_with_transposed_a_runs_swapped(engine, m, n, k, epilogue, monkeypatch):
    """x^T w with w narrower than a vector (a classifier head's weight gradient): the GEMM
    computes (x^T w)^T = w^T x into scratch and the epilogue reads it transposed. Below
    two vectors of rows (m=31) it is not swapped."""
    from ember.backends.cpu.gemm.matmul import plan_matmul
    from ember.backends.cpu.machine.host import host_isa

    monkeypatch.setenv("EMBER_GEMM", engine)

    def fn(b, x, w, p):
        prod = b.op("ember.matmul", b.op("ember.transpose", x, perm=[1, 0]), w)
        return [b.op("ember.sub", p, b.op("ember.mul", prod, prod)) if epilogue else prod]

    f = four_ways(graph([(k, m), (k, n), (m, n)], fn), rand((k, m), (k, n), (m, n)))
    (mm,) = [op for op in f.ops if op.name == "kernel.matmul"]
    lanes = host_isa().lanes("f32")
    assert plan_matmul(mm, host_isa(), 1).swapped == (n < lanes and m >= 2 * lanes)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m,n,k,split", [(157, 83, 301, "m"), (37, 150, 301, "n")])
def test_packed_threaded_gemm_with_edges(ta, tb, m, n, k, split, monkeypatch):
    """Large enough to block K and pack B (odd sizes: row and column edges, a K tail), split
    across threads by rows or by column panels, transposed operands read through strides."""
    from ember.backends.cpu.gemm import emit as gemm

    monkeypatch.setenv("EMBER_GEMM", "own")
    for name in ("BLOCK_A_BYTES", "PACK_B_BYTES", "THREAD_FLOPS"):
        monkeypatch.setattr(gemm, name, 1024)

    def fn(b, x, w, bias):
        a = b.op("ember.transpose", x, perm=[1, 0]) if ta else x
        bb = b.op("ember.transpose", w, perm=[1, 0]) if tb else w
        return [b.op("ember.tanh", b.op("ember.add", b.op("ember.matmul", a, bb), bias))]

    xs = (k, m) if ta else (m, k)
    ws = (n, k) if tb else (k, n)
    g = graph([xs, ws, (n,)], fn)
    f = fuse(g)
    mm = next(op for op in f.ops if op.name == "kernel.matmul")
    from ember.backends.cpu.gemm.matmul import plan_matmul
    from ember.backends.cpu.machine.host import host_isa

    pl = plan_matmul(mm, host_isa(), 2)
    plan = gemm.plan_own(pl.problem, host_isa(), 2)
    assert plan.blocked and plan.pack_b and plan.threads == 2
    assert plan.split == split
    inputs = rand(xs, ws, (n,))
    close(cpu.Executable(f, 2, use_cache=False)(inputs), interpreter.run(g, inputs))


EPILOGUES = {  # name: (extra input shapes, fn(builder, product, *extras) -> results)
    "tanh (space flattens)": ([], lambda b, y: [b.op("ember.tanh", y)]),
    "bias + gelu": ([("n",)], lambda b, y, bias: [b.op("ember.tanh", b.op("ember.add", y, bias))]),
    "residual, two results": ([("m", "n"), ("n",)], lambda b, y, r, bias: [
        b.op("ember.add", y, r), b.op("ember.mul", b.op("ember.add", y, bias), y)]),
}


@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("m,n,k,blocked,threads", [
    (45, 37, 29, False, 1), (157, 83, 301, True, 2), (157, 83, 301, True, 1),
    (37, 150, 301, True, 2), (120, 200, 96, False, 2)])
def test_epilogue_runs_on_each_block_of_rows_the_gemm_finishes(epilogue, m, n, k, blocked,
                                                              threads, monkeypatch):
    """Where the own GEMM's threads finish whole rows, its epilogue follows every block
    of rows (`.epilogue.rows`, no second pass); when threads split the columns (37 x 150
    blocked, on 2 threads) it stays a pass of its own. Unblocked, threads could split
    either and take the rows for the epilogue's sake (120 x 200). Both agree with the
    interpreter."""
    from ember.backends.cpu.gemm import emit as gemm

    monkeypatch.setenv("EMBER_GEMM", "own")
    if blocked:
        for name in ("BLOCK_A_BYTES", "PACK_B_BYTES", "THREAD_FLOPS"):
            monkeypatch.setattr(gemm, name, 1024)
    extras, fn = EPILOGUES[epilogue]
    shapes = [(m, k), (k, n)] + [tuple({"m": m, "n": n}[d] for d in s) for s in extras]
    g = graph(shapes, lambda b, x, w, *more: fn(b, b.op("ember.matmul", x, w), *more))
    f = fuse(g)
    assert kernels(f) == ["kernel.matmul"]
    exe = cpu.Executable(f, threads, use_cache=False)
    per_rows = not blocked or n <= m or threads == 1
    assert (".epilogue.rows" in exe.llvm_ir) == per_rows
    inputs = rand(*shapes)
    close(exe(inputs), interpreter.run(g, inputs))


@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("m,n,k", [(40, 24, 1200), (23, 70, 1201), (16, 16, 1024)])
def test_a_long_k_splits_across_threads(m, n, k, epilogue, monkeypatch):
    """A small C with a long K (a weight gradient X^T dY): each thread multiplies a slice
    of K into a product of its own, the products are added, then the epilogue runs. A K
    that 2 threads cannot slice evenly (1201) is not split."""
    from ember.backends.cpu.gemm import matmul
    from ember.backends.cpu.gemm.matmul import plan_matmul
    from ember.backends.cpu.machine.host import host_isa

    monkeypatch.setenv("EMBER_GEMM", "own")
    monkeypatch.setattr(matmul, "THREAD_FLOPS", 1024)

    def fn(b, x, g, bias):
        prod = b.op("ember.matmul", b.op("ember.transpose", x, perm=[1, 0]), g)
        return [b.op("ember.tanh", b.op("ember.add", prod, bias)) if epilogue else prod]

    g = graph([(k, m), (k, n), (n,)], fn)
    f = fuse(g)
    (mm,) = [op for op in f.ops if op.name == "kernel.matmul"]
    slices = plan_matmul(mm, host_isa(), 2).k_slices
    assert slices == (1 if k % 2 else 2)
    inputs = rand((k, m), (k, n), (n,))
    exe = cpu.Executable(f, 2, use_cache=False)
    assert (".ks.chunk" in exe.llvm_ir) == (slices > 1)
    close(exe(inputs), interpreter.run(g, inputs))


def test_a_batched_matmuls_epilogue_stays_a_pass_of_its_own():
    """Heads of attention: a GEMM per batch element, so the epilogue runs once after all."""
    g = graph([(3, 17, 9), (3, 9, 11)],
              lambda b, x, w: [b.op("ember.tanh", b.op("ember.matmul", x, w))])
    f = fuse(g)
    exe = cpu.Executable(f, 1, use_cache=False)
    assert ".epilogue.rows" not in exe.llvm_ir
    inputs = rand((3, 17, 9), (3, 9, 11))
    close(exe(inputs), interpreter.run(g, inputs))


@pytest.mark.parametrize("heads", [12, 3])
def test_a_batch_of_small_gemms_splits_across_threads(heads, monkeypatch):
    """Heads of attention too small to split one by one: threads take whole heads (a
    batch that threads cannot share evenly, 3, too), then the epilogue runs."""
    monkeypatch.setenv("EMBER_GEMM", "own")
    g = graph([(heads, 128, 64), (heads, 64, 128), (128,)],
              lambda b, q, k, m: [b.op("ember.add", b.op("ember.matmul", q, k), m)])
    f = fuse(g)
    exe = cpu.Executable(f, 2, use_cache=False)
    assert ".batch.chunk" in exe.llvm_ir
    inputs = rand((heads, 128, 64), (heads, 64, 128), (128,))
    close(exe(inputs), interpreter.run(g, inputs))


def test_blas_gemm_with_transposes(monkeypatch):
    from ember.backends.cpu.gemm import blas

    if blas.find() is None:
        pytest.skip("no OpenBLAS found next to numpy")
    monkeypatch.setenv("EMBER_GEMM", "blas")

    def fn(b, x, w):
        return [b.op("ember.matmul", b.op("ember.transpose", x, perm=[1, 0]), w),
                b.op("ember.matmul", w, b.op("ember.transpose", w, perm=[1, 0]))]

    g = graph([(40, 30), (40, 20)], fn)
    f = fuse(g)
    exe = cpu.Executable(f, use_cache=False)
    assert blas.find().sgemm in exe.llvm_ir
    inputs = rand((40, 30), (40, 20))
    close(exe(inputs), interpreter.run(g, inputs))


@pytest.mark.parametrize("tb,split", [(False, "m"), (True, "n")])
def test_direct_gemm_split_across_threads(tb, split, monkeypatch):
    """Straight on A (K not blocked) split by rows, or (B transposed, so packed) by column
    panels, each thread packing its own (4 panels: no thread more than half the work)."""
    from ember.backends.cpu.gemm import emit as gemm
    from ember.backends.cpu.gemm.matmul import plan_matmul
    from ember.backends.cpu.machine.host import host_isa

    monkeypatch.setenv("EMBER_GEMM", "own")
    monkeypatch.setattr(gemm, "THREAD_FLOPS", 1024)
    ws = (256, 30) if tb else (30, 150)
    g = graph([(45, 30), ws], lambda b, x, w: [b.op(
        "ember.matmul", x, b.op("ember.transpose", w, perm=[1, 0]) if tb else w)])
    f = fuse(g)
    mm = next(op for op in f.ops if op.name == "kernel.matmul")
    plan = gemm.plan_own(plan_matmul(mm, host_isa(), 2).problem, host_isa(), 2)
    assert not plan.blocked and plan.split == split and plan.threads == 2
    exe = cpu.Executable(f, 2, use_cache=False)
    assert "ember_parallel_for" in exe.llvm_ir  # the loop goes to the thread pool
    inputs = rand((45, 30), ws)
    close(exe(inputs), interpreter.run(g, inputs))


def test_batched_matmul_with_broadcast_batch():
    g = graph([(3, 1, 5, 7), (2, 7, 4)], lambda b, x, y: [
        b.op("ember.sigmoid", b.op("ember.matmul", x, y))])
    four_ways(g, rand((3, 1, 5, 7), (2, 7, 4)))
