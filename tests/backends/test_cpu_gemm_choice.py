"""Which GEMM a matmul gets on a CPU without a stored table (issue 15): the grid points a
compile needs are measured once and stored, later compiles read them, a damaged table is
measured again, EMBER_GEMM_TUNE=0 chooses by size; and the own GEMM itself, blocked for
the host's caches, on both vector widths (AVX2's 8 lanes, AVX-512's 16)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ember.backends import cpu
from ember.backends.cpu import codegen
from ember.backends.cpu.gemm import blas, cost
from ember.backends.cpu.gemm import emit as gemm
from ember.backends.cpu.gemm import timing as gemm_timing
from ember.backends.cpu.machine import cache, host
from ember.backends.cpu.machine.host import Caches, Isa
from ember.ir import Builder, Graph, TensorType, verify

FOREIGN = "pretend-cpu"  # a CPU name no table or DEFAULT_TABLE is for
THREADS = 2
needs_blas = pytest.mark.skipif(blas.find() is None, reason="no OpenBLAS: always the own GEMM")


def fake_speeds(point):
    """(own, blas) GFLOP/s a pretend measurement gives: OpenBLAS faster above 4M m*n*k."""
    m, n, k = point
    return (100.0, 200.0) if m * n * k > 1 << 22 else (200.0, 100.0)


@pytest.fixture
def foreign(tmp_path, monkeypatch):
    """This host pretends to be FOREIGN, with an empty cache directory; returns the list of
    points measured (by fake_speeds) and the table's path."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_NUM_THREADS", str(THREADS))
    for name in ("EMBER_GEMM", "EMBER_GEMM_TUNE"):
        monkeypatch.delenv(name, raising=False)
    for module in (cost, cache):
        monkeypatch.setattr(module, "host_cpu", lambda: FOREIGN)
    measured = []

    def measure(point, isa, threads):
        measured.append(point)
        return fake_speeds(point)

    monkeypatch.setattr(cost, "measure_point", measure)
    monkeypatch.setattr(cost, "_failed", set())
    cost.load_table.cache_clear()
    yield measured, cost.table_path(FOREIGN, THREADS)
    cost.load_table.cache_clear()


def mlp_graph() -> Graph:
    """x @ w1 @ w2 with x 128 x 784, w1 784 x 512, w2 512 x 512: two grid points."""
    g = Graph("mlp", [TensorType((128, 784), "f32"), TensorType((784, 512), "f32"),
                      TensorType((512, 512), "f32")])
    b = Builder(g.body)
    x, w1, w2 = g.args
    b.create("func.return", [b.op("ember.matmul", b.op("ember.matmul", x, w1), w2)])
    return verify(g)


def compile_and_check(g: Graph) -> cpu.Executable:
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(a.type.shape).astype(np.float32) for a in g.args]
    exe = cpu.Executable(g, use_cache=False)
    (got,) = exe(inputs)
    want = inputs[0].astype(np.float64)
    for w in inputs[1:]:
        want = want @ w
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-2)
    return exe


def calls_blas(exe: cpu.Executable) -> bool:
    return blas.find().sgemm in exe.llvm_ir


def stored(path) -> dict:
    return {tuple(map(int, k.split("x"))): tuple(v)
            for k, v in json.loads(path.read_text()).items()}


NEEDED = [(128, 512, 784), (128, 512, 512)]


@needs_blas
def test_a_foreign_cpu_measures_exactly_the_points_a_compile_needs_and_stores_them(foreign):
    measured, path = foreign
    exe = compile_and_check(mlp_graph())
    assert measured == NEEDED  # each once, though every matmul is planned twice
    assert stored(path) == {p: fake_speeds(p) for p in NEEDED}
    assert calls_blas(exe)  # what the (pretend) measurement said


@needs_blas
def test_a_second_compile_reads_the_stored_points_without_measuring(foreign):
    measured, path = foreign
    compile_and_check(mlp_graph())
    measured.clear()
    cost.load_table.cache_clear()  # as a new process would
    exe = compile_and_check(mlp_graph())
    assert measured == []
    assert calls_blas(exe)


@needs_blas
def test_a_point_another_process_stored_meanwhile_is_read_not_measured(foreign):
    measured, path = foreign
    assert cost.load_table(FOREIGN, THREADS) == {}
    cost.write_table(path, {(128, 512, 784): (300.0, 100.0)})
    p = gemm.GemmProblem(128, 512, 784, 784, 1, 512, 1, 512, "f32")
    assert cost.choose(p, host.host_isa(), THREADS) == "own"
    assert measured == []


@needs_blas
def test_measured_points_merge_with_the_stored_ones(foreign):
    measured, path = foreign
    cost.write_table(path, {(64, 64, 64): (1.0, 2.0)})
    compile_and_check(mlp_graph())
    assert stored(path) == {(64, 64, 64): (1.0, 2.0), **{p: fake_speeds(p) for p in NEEDED}}


@needs_blas
@pytest.mark.parametrize("text", [b"", b'{"128x512x784": [1', b"[1, 2]", b'{"1x1": [1, 2]}'])
def test_a_damaged_table_is_ignored_with_a_warning_and_measured_again(foreign, text):
    measured, path = foreign
    path.write_bytes(text)
    with pytest.warns(UserWarning, match="ignoring the damaged GEMM table"):
        compile_and_check(mlp_graph())
    assert measured == NEEDED
    assert stored(path) == {p: fake_speeds(p) for p in NEEDED}


@needs_blas
def test_with_tuning_off_the_rule_chooses_and_nothing_is_measured(foreign, monkeypatch):
    measured, path = foreign
    monkeypatch.setenv("EMBER_GEMM_TUNE", "0")
    assert calls_blas(compile_and_check(mlp_graph()))  # large: OpenBLAS
    small = Graph("small", [TensorType((48, 40), "f32"), TensorType((40, 56), "f32")])
    b = Builder(small.body)
    b.create("func.return", [b.op("ember.matmul", *small.args)])
    assert not calls_blas(compile_and_check(verify(small)))  # small: the own GEMM
    assert measured == [] and not path.exists()


@needs_blas
def test_a_failed_measurement_warns_once_and_falls_back_to_the_rule(foreign, monkeypatch):
    measured, path = foreign
    calls = []

    def fail(point, isa, threads):
        calls.append(point)
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(cost, "measure_point", fail)
    with pytest.warns(UserWarning, match="could not measure the GEMM engines"):
        assert calls_blas(compile_and_check(mlp_graph()))
    assert calls == NEEDED[:1] and not path.exists()


@needs_blas
def test_a_real_measurement_is_stored_and_decides(foreign, monkeypatch):
    measured, path = foreign
    monkeypatch.setattr(cost, "measure_point", gemm_timing.measure_point)
    g = Graph("g", [TensorType((64, 64), "f32"), TensorType((64, 64), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.matmul", *g.args)])
    exe = compile_and_check(verify(g))
    ((point, (own, bl)),) = stored(path).items()
    assert point == (64, 64, 64) and own > 0 and bl > 0
    assert calls_blas(exe) == (own * cost.MARGIN < bl)


CONCURRENT = textwrap.dedent("""
    import sys, time
    from ember.backends.cpu.gemm import cost, emit as gemm
    from ember.backends.cpu.machine import host
    cost.host_cpu = lambda: sys.argv[1]
    def measure(point, isa, threads):
        time.sleep(0.05)
        return (float(point[0]), 1.0)
    cost.measure_point = measure
    m, n, k = map(int, sys.argv[2].split("x"))
    p = gemm.GemmProblem(m, n, k, k, 1, n, 1, n, "f32")
    print(cost.choose(p, host.host_isa(), 2))
""")


@needs_blas
def test_concurrent_processes_keep_every_point_and_a_whole_file(tmp_path):
    """Each process measures a different point into the same table at the same time."""
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path)}
    env.pop("EMBER_GEMM", None)
    points = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512)]
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, FOREIGN,
                               "x".join(map(str, p))], env=env, stdout=subprocess.PIPE,
                              text=True) for p in points]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == ["own"] * 4
    assert stored(tmp_path / cost.table_path(FOREIGN, 2).name) == {
        p: (float(p[0]), 1.0) for p in points}


def test_default_table_is_for_the_host_it_was_measured_on_only(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    cost.load_table.cache_clear()
    name, threads = cost.DEFAULT_HOST
    assert cost.load_table(name, threads) is cost.DEFAULT_TABLE
    assert cost.load_table(name, threads + 1) == {}
    assert cost.load_table(FOREIGN, threads) == {}
    assert set(cost.DEFAULT_TABLE) == set(cost.GRID)  # every nearest point is in it
    cost.load_table.cache_clear()


@pytest.mark.parametrize("engine", ["own", pytest.param("blas", marks=needs_blas)])
def test_measure_times_one_engine(engine):
    assert gemm_timing.measure(16, 16, 16, engine, repeat=1) > 0


def test_the_rule_is_never_5_percent_below_openblas_where_speeds_are_known():
    for (m, n, k), (own, bl) in cost.DEFAULT_TABLE.items():
        p = gemm.GemmProblem(m, n, k, k, 1, n, 1, n, "f32")
        assert (own if cost.rule(p) == "own" else bl) >= 0.95 * bl


# -- the own GEMM: blocked for the caches, both vector widths ----------------------------------

def test_host_caches_are_read_from_sysfs(tmp_path, monkeypatch):
    for i, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                             ("2", "Unified", "2048K"),
                                             ("3", "Unified", "105M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for f, v in (("level", level), ("type", kind), ("size", size)):
            (d / f).write_text(v + "\n")
    monkeypatch.setattr(host, "CACHE_DIR", tmp_path)
    assert host.host_caches.__wrapped__() == Caches(48 << 10, 2 << 20)
    monkeypatch.setattr(host, "CACHE_DIR", tmp_path / "absent")
    assert host.host_caches.__wrapped__() == host.DEFAULT_CACHES


def test_a_blocks_rows_follow_l2():
    isa = Isa(512, 32)
    small, large = (gemm.blocking(isa, "f32", 1024, Caches(32 << 10, l2)).mc
                    for l2 in (1 << 20, 2 << 20))
    assert large == 2 * small and small * gemm.KC * 4 == (1 << 20) // gemm.A_BLOCK_L2
    assert gemm.blocking(isa, "f32", 1024, Caches(32 << 10, 256 << 10)).mc == gemm.MC_MIN


@pytest.mark.parametrize("m,threads", [(512, 1), (512, 2), (301, 2), (2048, 2), (128, 1)])
def test_row_blocks_are_even(m, threads, monkeypatch):
    """No short last row block (512 rows: 174 + 174 + 164, not 252 + 252 + 8), and when
    threads split the rows, as many blocks for each."""
    monkeypatch.setattr(gemm, "host_caches", lambda: Caches(32 << 10, 1 << 20))
    isa = Isa(512, 32)
    p = gemm.GemmProblem(m, 128, 2048, 1, m, 128, 1, 128, "f32")
    plan = gemm.plan_own(p, isa, threads)
    mc, mr = plan.mc, plan.blk.mr
    blocks = -(-m // mc)
    assert plan.blocked and plan.split == "m" and mc % mr == 0
    assert mc <= plan.blk.mc and m - (blocks - 1) * mc > mc - blocks * mr
    assert blocks % plan.threads == 0


def test_the_cache_key_has_the_caches(monkeypatch):
    before, host = cache.options(2), cache.host_caches()
    monkeypatch.setattr(cache, "host_caches", lambda: Caches(2 * host.l1d, 2 * host.l2))
    assert cache.options(2) != before


ISAS = {"avx2": Isa(256, 16), "avx512": Isa(512, 32)}
SHAPES = [  # (m, n, k, transpose a, transpose b): odd edges everywhere
    (7, 5, 3, False, False),
    (37, 150, 301, False, False),   # column panels split across threads
    (157, 83, 301, False, False),   # row blocks split, K tail past KC
    (157, 83, 301, True, True),     # operands read through strides, B packed
    (200, 3, 67, False, False),     # narrow: one vector per row, a tall tile
    (301, 129, 260, True, False),   # several A blocks
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m,n,k,ta,tb", SHAPES)
def test_the_own_gemm_gives_numpys_values_on_both_vector_widths(isa, m, n, k, ta, tb,
                                                                monkeypatch):
    for name in ("BLOCK_A_BYTES", "PACK_B_BYTES", "THREAD_FLOPS"):  # block, pack and split it all
        monkeypatch.setattr(gemm, name, 1024)
    monkeypatch.setattr(gemm, "host_caches", lambda: Caches(32 << 10, 64 << 10))  # A blocks
    rng = np.random.default_rng(1)
    a = rng.standard_normal((k, m) if ta else (m, k), np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), np.float32)
    a, b = (a.T if ta else a), (b.T if tb else b)
    bench = gemm_timing.GemmBench(a, b, ISAS[isa], 2, ("own",))
    assert gemm.plan_own(bench.p, ISAS[isa], 2).nr % ISAS[isa].lanes("f32") == 0
    bench.run("own")
    np.testing.assert_allclose(bench.c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("ta,tb", [(True, False), (False, True)])
def test_one_block_of_rows_packs_b_a_k_block_at_a_time(isa, ta, tb, monkeypatch):
    """One thread, rows that fit one block (a slice of a weight gradient's long K): B is
    packed a kc-deep block at a time into kc x N of scratch, the K tail (301 = 256 + 45)
    and N's last panel too, with numpy's values."""
    monkeypatch.setattr(gemm, "PACK_B_BYTES", 1024)
    m, n, k = 37, 83, 301
    rng = np.random.default_rng(3)
    a = rng.standard_normal((k, m) if ta else (m, k), np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), np.float32)
    a, b = (a.T if ta else a), (b.T if tb else b)
    bench = gemm_timing.GemmBench(a, b, ISAS[isa], 1, ("own",))
    plan = gemm.plan_own(bench.p, ISAS[isa], 1)
    assert plan.pack_per_k and plan.scratch == plan.npanels * plan.nr * gemm.KC * 4
    bench.run("own")
    np.testing.assert_allclose(bench.c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("isa", ISAS)
def test_a_compiled_matmul_with_an_epilogue_on_both_vector_widths(isa, monkeypatch):
    """Through the backend: the plan's Isa decides every vector width."""
    monkeypatch.setenv("EMBER_GEMM", "own")
    monkeypatch.setattr(codegen, "host_isa", lambda: ISAS[isa])
    g = Graph("f", [TensorType((67, 45), "f32"), TensorType((45, 131), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.relu", b.op("ember.matmul", *g.args))])
    exe = cpu.Executable(verify(g), use_cache=False)
    assert f"ember.uk.f32.{ISAS[isa].lanes('f32')}x" in exe.llvm_ir
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((67, 45), np.float32), rng.standard_normal((45, 131), np.float32)
    np.testing.assert_allclose(exe([x, w])[0], np.maximum(x.astype(np.float64) @ w, 0),
                               rtol=1e-4, atol=1e-4)
