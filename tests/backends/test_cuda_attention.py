"""The cuda kernels of `kernel.attention` / `kernel.attention_grad` (backends/cuda/attention.py)
against the numpy interpreter, through the CPU emulator of the generated CUDA C (g++, CUDA's
block and barrier semantics) and on a GPU when there is one; and the source compiles with
`nvcc -ptx -arch=sm_90` (f32 kernels without register spills when ptxas is here).

Each case is one graph: the forward op on q, k, v read through their maps, then the
backward op on q, k, v, the forward's o and lse, and an upstream gradient do; every result
(o, lse, dq, dk, dv) is compared, written contiguously or (layout "bthd_out") through
`out_maps` into the [B, T, H, ...] buffers the projections read. Emulated cases stay small
(T <= 40): the emulator runs every thread of every block as a fiber.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np
import pytest

from ember.backends import cuda, interpreter
from ember.backends.cuda import attention as A
from ember.backends.cuda import emulate
from ember.backends.cuda.codegen import lower
from ember.backends.cuda.program import Launch
from ember.backends.errors import UnsupportedOpError
from ember.backends.strides import contiguous_strides
from ember.ir import Builder, Graph, TensorType, numpy_dtype, verify

pytestmark = pytest.mark.slow  # nvcc compiles


try:
    cuda.check_available()
    GPU_REASON = None
except cuda.CudaUnavailableError as e:
    GPU_REASON = f"no usable GPU here: {e}"
needs_emulator = pytest.mark.skipif(not emulate.available(), reason="the CUDA emulator needs g++")
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=GPU_REASON or "")
NVCC, PTXAS = shutil.which("nvcc"), shutil.which("ptxas")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
TOL = {"f32": 1e-5, "f64": 1e-12}


@dataclass(frozen=True)
class Case:
    """One attention shape. layout: how q, k, v and do sit in their buffers:
    "contiguous"; "bthd" ([B, T, H * D] projections, batch [B, H]); "transposed" ([..., D, T]);
    "shared_kv" (k and v broadcast over the last batch dim, stride 0); "self" (k is q);
    "bthd_out" (as bthd, and every result written as [B, T, H, ...] through out_maps)."""

    batch: tuple[int, ...]
    tq: int
    tk: int
    d: int
    dv: int
    causal: bool
    dtype: str = "f32"
    layout: str = "contiguous"

    def __str__(self) -> str:
        c = "causal" if self.causal else "full"
        return (f"{'x'.join(map(str, self.batch)) or 'scalar'}-q{self.tq}k{self.tk}-"
                f"d{self.d}v{self.dv}-{c}-{self.dtype}-{self.layout}")


def _operand(case: Case, rows: int, cols: int, name: str) -> tuple[tuple[int, ...], list[int]]:
    """(buffer shape, map over [*batch, rows, cols]) of one operand in the case's layout."""
    b = list(case.batch)
    if case.layout in ("bthd", "bthd_out"):
        nb, h = b
        return (nb, rows, h * cols), [rows * h * cols, cols, h * cols, 1]
    if case.layout == "transposed":
        shape = (*b, cols, rows)
        st = contiguous_strides(shape)
        return shape, [*st[:-2], 1, rows]
    if case.layout == "shared_kv" and name in ("k", "v"):
        shape = (*b[:-1], rows, cols)
        st = contiguous_strides(shape)
        return shape, [*st[:-2], 0, cols, 1]
    shape = (*b, rows, cols)
    return shape, list(contiguous_strides(shape))


def _results(case: Case, shapes: dict[str, tuple[int, ...]]) -> dict:
    """For "bthd_out", out_maps and out_types putting each result ([B, H, T, ...] logical
    shape in `shapes`) in a [B, T, H, ...] buffer; contiguous results otherwise."""
    if case.layout != "bthd_out":
        return {}
    types, maps = [], []
    for nb, h, t, *d in shapes.values():
        types.append(TensorType((nb, t, h, *d), case.dtype))
        st = contiguous_strides(types[-1].shape)
        maps.append([st[0], st[2], st[1], *st[3:]])
    return {"out_maps": maps, "out_types": types}


def build(*cases: Case) -> Graph:
    """Per case: q, k, v, do -> o, lse, dq, dk, dv through one attention and one
    attention_grad op (all cases in one graph)."""
    specs = []
    for case in cases:
        dims = {"q": (case.tq, case.d), "k": (case.tk, case.d), "v": (case.tk, case.dv),
                "do": (case.tq, case.dv)}
        ops = {n: _operand(case, *dims[n], n) for n in dims}
        specs.append((case, ops, ["q", "v", "do"] if case.layout == "self" else list(dims)))
    g = Graph("attention", [TensorType(ops[n][0], c.dtype) for c, ops, names in specs
                            for n in names])
    b = Builder(g.body)
    args, outs = iter(g.args), []
    for case, ops, names in specs:
        arg = {n: next(args) for n in names}
        arg.setdefault("k", arg["q"])
        maps = [ops[n][1] for n in ("q", "k", "v")]
        attrs = dict(batch=list(case.batch), sizes=[case.tq, case.tk, case.d, case.dv],
                     maps=maps, causal=case.causal, scale=0.9 / case.d ** 0.5)
        bh, (tq, tk, d, dv) = case.batch, attrs["sizes"]
        fwd = _results(case, {"o": (*bh, tq, dv), "lse": (*bh, tq)})
        o, lse = b.create("kernel.attention", [arg["q"], arg["k"], arg["v"]],
                          dict(attrs, **fwd)).results
        o_lse = fwd.get("out_maps", [list(contiguous_strides(o.type.shape)),
                                     list(contiguous_strides(lse.type.shape))])
        bwd = _results(case, {"dq": (*bh, tq, d), "dk": (*bh, tk, d), "dv": (*bh, tk, dv)})
        grads = b.create("kernel.attention_grad",
                         [arg["q"], arg["k"], arg["v"], o, lse, arg["do"]],
                         dict(attrs, maps=maps + o_lse + [ops["do"][1]], **bwd)).results
        outs += [o, lse, *grads]
    b.create("func.return", outs)
    return verify(g)


def inputs(g: Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.5, 1.5, a.type.shape).astype(numpy_dtype(a.type.dtype))
            for a in g.args]


def check(case: Case, run) -> None:
    g = build(case)
    xs = inputs(g)
    want = interpreter.run(g, xs)
    got = run(g, xs)
    tol = TOL[case.dtype]
    bad = []
    for name, x, y in zip(["o", "lse", "dq", "dk", "dv"], got, want):
        if x.shape != y.shape or x.dtype != y.dtype or not np.allclose(x, y, rtol=tol, atol=tol):
            err = np.abs(x.astype(np.float64) - y).max() if x.shape == y.shape else "shape"
            bad.append(f"{name} {list(y.shape)}: max error {err}")
    assert not bad, f"{case}: " + "; ".join(bad)


def emulated(g: Graph, xs) -> list[np.ndarray]:
    return emulate.EmulatedExecutable(g)(xs)


def on_gpu(g: Graph, xs) -> list[np.ndarray]:
    return [a.get() for a in cuda.compile(g)(xs)]


SWEEP = [
    Case((2, 3), 5, 5, 4, 4, True, layout="bthd"),
    Case((2, 2), 33, 33, 16, 16, False, layout="bthd"),
    Case((2, 3), 21, 14, 8, 5, True, "f64", layout="bthd_out"),
    Case((), 37, 23, 16, 8, True),                      # Tq > Tk, no batch
    Case((3,), 17, 40, 5, 12, True, "f64", "transposed"),  # Tq < Tk, odd dims
    Case((2,), 40, 31, 24, 7, False, "f64"),
    Case((2, 2), 19, 26, 8, 8, True, layout="shared_kv"),
    Case((1, 3, 1), 29, 29, 9, 13, True, layout="self"),
    Case((2,), 9, 12, 128, 64, True),                   # the largest tiled head dims
]
SMALL_TILES = [  # several query and key tiles per row: online softmax, causal skipping
    (Case((2,), 40, 40, 8, 8, True), (8, 8)),
    (Case((), 37, 19, 6, 10, True, "f64"), (8, 8)),
    (Case((2,), 13, 35, 7, 5, True, layout="transposed"), (8, 8)),
    (Case((3,), 27, 17, 4, 4, False), (8, 8)),
    (Case((2, 2), 11, 14, 3, 6, True, layout="bthd"), (4, 4)),
    (Case((2, 2), 13, 11, 4, 6, False, layout="bthd_out"), (4, 4)),
]


@needs_emulator
@pytest.mark.parametrize("case", SWEEP, ids=str)
def test_emulated_kernels_match_the_interpreter(case):
    check(case, emulated)


@needs_emulator
@pytest.mark.parametrize("case,tiles", SMALL_TILES, ids=str)
def test_emulated_kernels_match_over_many_tiles(case, tiles, monkeypatch):
    """Tiles of 8 or 4 rows, so every sequence above spans several tiles."""
    monkeypatch.setattr(A, "TILES", (tiles,))
    check(case, emulated)


@needs_emulator
def test_blocks_stride_over_batches_beyond_the_grid(monkeypatch):
    """Grid y is capped (65535 on a GPU, 2 here): each block loops over batch indices."""
    monkeypatch.setattr(A.L, "MAX_GRID_YZ", 2)
    case = Case((5,), 9, 7, 4, 3, True)
    assert {s.config.grid[1] for s in lower(build(case)).steps
            if not s.kernel.endswith("_drow")} == {2}
    check(case, emulated)


@needs_emulator
def test_the_emulated_check_catches_a_missing_mask(monkeypatch):
    """The comparison is a real check: kernels that drop the causal mask fail it."""
    case = Case((2,), 12, 12, 4, 4, True)
    monkeypatch.setattr(A, "_masked", lambda g: f"q0 + i >= {g.tq} || k0 + j >= {g.tk}")
    with pytest.raises(AssertionError, match="max error"):
        check(case, emulated)


@needs_gpu
@pytest.mark.parametrize("case", SWEEP + [Case((16, 4), 256, 256, 16, 16, True),
                                          Case((2, 2), 300, 200, 64, 32, True, layout="bthd"),
                                          Case((2,), 129, 257, 128, 128, False, "f64")], ids=str)
def test_gpu_kernels_match_the_interpreter(case):
    check(case, on_gpu)


def test_the_scores_never_reach_global_memory():
    """Forward: one launch; backward: drow, dK/dV, dQ launches and one [batch, Tq] scratch."""
    p = lower(build(Case((2, 3), 30, 20, 16, 8, True, layout="bthd")))
    launches = [s.kernel for s in p.steps]
    assert all(isinstance(s, Launch) for s in p.steps)
    assert [re.sub(r"^k\d+_", "", n) for n in launches] == [
        "attention", "attention_grad_drow", "attention_grad_dkv", "attention_grad_dq"]
    assert [s.type.shape for s in p.slots if s.kind == "scratch"] == [(2 * 3 * 30,)]


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("d", [8, 16, 64, 96, 128, 256])
def test_tiles_fit_shared_memory_at_every_head_dim(d, dtype):
    p = lower(build(Case((4,), 512, 512, d, d, True, dtype)))
    tiled = [s for s in p.steps if not s.kernel.endswith("_drow")]
    assert len(tiled) == 3
    for s in tiled:
        assert s.config.shared <= A.SMEM_BYTES and s.config.block == (A.THREADS, 1, 1)
        assert s.config.grid[1] == 4


def test_head_dims_beyond_any_tiling_are_refused():
    with pytest.raises(UnsupportedOpError, match="shared memory"):
        lower(build(Case((1,), 8, 8, 1024, 1024, False, "f64")))


@functools.cache
def _nvcc_source() -> str:
    """Every kernel variant in one translation unit: dtypes, causal or not, head dims."""
    cases = [Case((2, 4), 256, 256, d, d, c, dt, "bthd") for d in (16, 64, 128)
             for dt in ("f32", "f64") for c in (True, False)]
    cases += [Case((3,), 17, 40, 5, 12, True, "f64", "transposed"), Case((), 100, 70, 40, 24, True),
              Case((2, 2), 19, 26, 8, 8, True, "f32", "shared_kv"),
              Case((2, 4), 64, 64, 32, 32, True, "f32", "bthd_out")]
    return lower(build(*cases)).source


@needs_nvcc
def test_the_kernels_compile_with_nvcc(tmp_path):
    """nvcc -ptx -arch=sm_90 accepts every variant with no warning; with ptxas, no kernel
    spills more than a few bytes (ptxas 13 trades a few spilled words for occupancy under
    __launch_bounds__(128); accumulators in local memory would be hundreds)."""
    source = _nvcc_source()
    cu, ptx = tmp_path / "attention.cu", tmp_path / "attention.ptx"
    cu.write_text(source)
    r = subprocess.run([NVCC, "-ptx", "-arch=sm_90", str(cu), "-o", str(ptx)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr[-3000:]
    entries = re.findall(r"\.visible \.entry (\w+)\(", ptx.read_text())
    assert len(entries) == source.count('extern "C"')
    if PTXAS:
        r = subprocess.run([PTXAS, "-arch=sm_90", "-v", str(ptx), "-o", str(tmp_path / "a.o")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        spills = [int(s) for s in re.findall(r"(\d+) bytes spill stores", r.stderr)]
        assert len(spills) == len(entries) and max(spills) <= 32, r.stderr[-3000:]
