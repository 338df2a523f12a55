"""The bf16 GEMM (backends/cpu/gemm/bf16.py), on AMX tiles and on AVX512-BF16 dot products:
`ember.matmul {dtype = "f32"}` of bf16 operands equals float64's product of the same
values within f32's rounding, for every edge (M, N, K not multiples of the tiles), every
operand layout the packers read (rows, columns, strided), 1 to 4 threads, with and without
an epilogue (after the whole product, or on each block of rows as it is finished); a CPU
with neither keeps the matmuls in f32 and says so once."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import ember.backends.cpu as cpu
from ember.backends.cpu import codegen
from ember.backends.cpu.gemm import bf16
from ember.backends.cpu.gemm.bf16 import plan_bf16
from ember.backends.cpu.gemm.matmul import plan_matmul
from ember.backends.cpu.machine.host import Caches, Isa, host_isa
from ember.ir.parser import parse
from ember.passes import PassManager, parse_pipeline

HOST = host_isa()
KERNELS = [pytest.param("tiles", marks=pytest.mark.skipif(not HOST.bf16_tiles,
                                                          reason="no AMX-BF16 here")),
           pytest.param("dots", marks=pytest.mark.skipif(not HOST.bf16_dot,
                                                         reason="no AVX512-BF16 here"))]


@pytest.fixture(params=KERNELS)
def kernel(request, monkeypatch) -> str:
    """The bf16 kernel the cpu backend generates in this test: a host with AMX also runs
    the dot products (an Isa without the tiles), compiled afresh (the compile cache's key
    tells hosts apart, not kernels)."""
    if request.param == "dots":
        monkeypatch.setattr(codegen, "host_isa", lambda: Isa(HOST.bits, HOST.regs, False, True))
    monkeypatch.setenv("EMBER_CACHE", "0")
    return request.param


def matmul_graph(m: int, n: int, k: int, ta: bool, tb: bool, bias: bool = False):
    """C = A B (+ bias, relu) with A given as [k, m] when `ta`, B as [n, k] when `tb`,
    fused as the pipeline fuses it."""
    at, bt = (f"tensor<{k}x{m}xbf16>" if ta else f"tensor<{m}x{k}xbf16>",
              f"tensor<{n}x{k}xbf16>" if tb else f"tensor<{k}x{n}xbf16>")
    out = f"tensor<{m}x{n}xf32>"
    args = f"%a: {at}, %b: {bt}" + (f", %bias: tensor<{n}xf32>" if bias else "")
    body = []
    a, b = "%a", "%b"
    if ta:
        body.append(f'%at = "ember.transpose"(%a) {{perm = [1, 0]}} : ({at}) -> '
                    f'tensor<{m}x{k}xbf16>')
        a = "%at"
    if tb:
        body.append(f'%bt = "ember.transpose"(%b) {{perm = [1, 0]}} : ({bt}) -> '
                    f'tensor<{k}x{n}xbf16>')
        b = "%bt"
    body.append(f'%c = "ember.matmul"({a}, {b}) {{dtype = "f32"}} : (tensor<{m}x{k}xbf16>, '
                f'tensor<{k}x{n}xbf16>) -> {out}')
    result = "%c"
    if bias:
        body.append(f'%d = "ember.add"(%c, %bias) : ({out}, tensor<{n}xf32>) -> {out}')
        body.append(f'%e = "ember.relu"(%d) : ({out}) -> {out}')
        result = "%e"
    body.append(f'func.return {result} : {out}')
    text = f"func.func @main({args}) -> {out} {{\n" + "\n".join(body) + "\n}"
    return PassManager(parse_pipeline("fuse")).run(parse(text))


def operands(m: int, n: int, k: int, ta: bool, tb: bool):
    rng = np.random.default_rng(m * 10007 + n * 101 + k)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(ml_dtypes.bfloat16)
    return a, b


def reference(a, b, ta: bool, tb: bool) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64.T if ta else a64) @ (b64.T if tb else b64)


SHAPES = [(1, 1, 1), (33, 17, 45), (100, 70, 3), (64, 48, 96), (200, 96, 300)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_product_equals_float64(kernel, shape, layout):
    ta, tb = layout[0] == "t", layout[1] == "t"
    a, b = operands(*shape, ta, tb)
    got = cpu.compile(matmul_graph(*shape, ta, tb), threads=2)([a, b], {})[0]
    want = reference(a, b, ta, tb)
    k = shape[2]
    # f32 sums of exact products: within K f32 roundings of the largest partial sum
    np.testing.assert_allclose(got, want, rtol=0, atol=k * 2.0 ** -23 * np.abs(want).max())


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("shape", [(256, 96, 64), (300, 40, 70)],
                         ids=lambda s: "x".join(map(str, s)))
def test_threads_and_epilogue(kernel, shape, threads):
    m, n, k = shape
    a, b = operands(m, n, k, False, True)
    bias = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    exe = cpu.compile(matmul_graph(m, n, k, False, True, bias=True), threads=threads)
    got = exe([a, b, bias], {})[0]
    want = np.maximum(reference(a, b, False, True) + bias, 0)
    np.testing.assert_allclose(got, want, rtol=0, atol=k * 2.0 ** -23 * np.abs(want).max())


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_epilogue_follows_each_block_of_rows(kernel, monkeypatch, threads):
    """Where A spans several blocks of rows (L2 made small here), each thread runs the
    epilogue on every block it finishes, the last block's rows past M left out."""
    monkeypatch.setattr(bf16, "host_caches", lambda: Caches(48 << 10, 256 << 10))
    m, n, k = 1000, 40, 96
    graph = matmul_graph(m, n, k, False, True, bias=True)
    (op,) = [o for o in graph.walk() if o.name == "kernel.matmul"]
    pl = plan_matmul(op, codegen.host_isa(), threads)
    assert pl.problem.finish_rows and bf16.bf16_finishes_rows(pl.problem, codegen.host_isa(),
                                                                threads)
    assert plan_bf16(pl.problem, codegen.host_isa(), threads).blocks > threads
    a, b = operands(m, n, k, False, True)
    bias = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    got = cpu.compile(graph, threads=threads)([a, b, bias], {})[0]
    want = np.maximum(reference(a, b, False, True) + bias, 0)
    np.testing.assert_allclose(got, want, rtol=0, atol=k * 2.0 ** -23 * np.abs(want).max())


@pytest.mark.parametrize("isa", [Isa(512, 32, True, True), Isa(512, 32, False, True)],
                         ids=["tiles", "dots"])
def test_plan_reads_aligned_rows_in_place(isa):
    """A whose rows are unit-stride with 32 | K and 32 | M is read where it is; any other
    A is packed, and the scratch holds it. (Plans only: no bf16 instruction runs.)"""
    def plan(m, k):
        graph = matmul_graph(m, 64, k, False, False)
        (op,) = [o for o in graph.walk() if o.name == "kernel.matmul"]
        return plan_matmul(op, isa, 2)

    aligned, ragged = plan(64, 96), plan(60, 96)
    assert aligned.engine == ragged.engine == "bf16"
    assert plan_bf16(aligned.problem, isa, 2).kernel == ("tiles" if isa.bf16_tiles else "dots")
    assert plan_bf16(aligned.problem, isa, 2).a_direct
    assert not plan_bf16(ragged.problem, isa, 2).a_direct
    assert ragged.scratch > aligned.scratch


def test_without_a_bf16_gemm_low_precision_runs_in_f32_and_says_so_once(monkeypatch):
    monkeypatch.setattr(cpu, "host_isa", lambda: Isa(512, 32))
    cpu._f32_notice.cache_clear()
    assert cpu.LEGALIZE_LOW_PRECISION == "widen-low-precision,low-precision-storage"
    graph = parse("""func.func @main(%x: tensor<4xf32>) -> tensor<4xbf16> {
      %y = "ember.cast"(%x) {dtype = "bf16"} : (tensor<4xf32>) -> tensor<4xbf16>
      func.return %y : tensor<4xbf16>
    }""")
    with pytest.warns(UserWarning, match="low-precision matmuls run in f32"):
        exe = cpu.compile(graph)
    x = np.array([1.0, 2.5, -3.0, 1e-3], np.float32)
    assert exe([x], {})[0].tolist() == x.astype(ml_dtypes.bfloat16).tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cpu.compile(graph)  # once per process
