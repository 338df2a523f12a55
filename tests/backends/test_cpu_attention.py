"""`kernel.attention` and `kernel.attention_grad` on the cpu (backends/cpu/attention*.py)
against the numpy interpreter: odd sizes, Tq != Tk, D != Dv, every batch rank, operands as
the strided views multi-head attention makes ([B, T, H*D] projections), contiguous,
broadcast (a stride-0 head dim) and transposed, results written through `out_maps` into
[B, T, H, D] buffers, causal on and off, one and two threads, both vector widths; the
gradients against finite differences; no read past (or write outside) a buffer.

One graph runs the forward and feeds its o and lse to the backward, so a single compile
checks both kernels.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.backends import cpu, interpreter
from ember.backends.cpu import codegen
from ember.backends.cpu.attention import forward as attention
from ember.backends.cpu.call import buffers
from ember.backends.cpu.machine.host import Isa, host_isa
from ember.backends.cpu.parallel import outline as cpu_threads
from ember.ir import Builder, Graph, TensorType, verify
from ember.ir.dialects.kernel_attention import logical_shapes
from ember.ir.opdef import InferenceError

pytestmark = pytest.mark.slow  # a sweep of attention geometries


RTOL = {"f32": 1e-5, "f64": 1e-12}
NP = {"f32": np.float32, "f64": np.float64}
LAYOUTS = ("heads", "contiguous", "broadcast", "transposed", "heads_out")


def _contiguous(shape) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def _buffer(layout: str, batch: list[int], t: int, d: int, shared: bool):
    """(buffer shape, map over [*batch, t, d]) of one of q, k, v, do in `layout`; k and v
    are `shared` (the ones a broadcast layout reads through a stride-0 head dim)."""
    if layout in ("heads", "heads_out"):
        bsz, h = batch
        return (bsz, t, h * d), [t * h * d, d, h * d, 1]
    if layout == "broadcast" and shared and batch:
        shape = (*batch[:-1], t, d)
        return shape, _contiguous(shape)[:-2] + [0, d, 1]
    if layout == "transposed":
        shape = (*batch, d, t)
        return shape, _contiguous(shape)[:-2] + [1, t]
    shape = (*batch, t, d)
    return shape, _contiguous(shape)


def _results(layout: str, names, attrs: dict, dtype: str) -> dict:
    """"heads_out": `out_maps` and `out_types` that put every result in the [B, T, H, ...]
    layout the projections read (lse as [B, T, H]); other layouts: contiguous results."""
    if layout != "heads_out":
        return {}
    shapes = logical_shapes(attrs)
    types, maps = [], []
    for n in names:
        bsz, h, t, *d = shapes[n]
        types.append(TensorType((bsz, t, h, *d), dtype))
        st = _contiguous(types[-1].shape)
        maps.append([st[0], st[2], st[1], *st[3:]])
    return {"out_maps": maps, "out_types": types}


def attention_graph(layout, batch, tq, tk, d, dv, causal, dtype, scale=None) -> Graph:
    """(q, k, v, do) -> (o, lse, dq, dk, dv): the forward, and the backward from its o and
    lse."""
    batch = list(batch)
    bufs = [_buffer(layout, batch, tq, d, False), _buffer(layout, batch, tk, d, True),
            _buffer(layout, batch, tk, dv, True), _buffer(layout, batch, tq, dv, False)]
    g = Graph("f", [TensorType(s, dtype) for s, _ in bufs])
    b = Builder(g.body)
    q, k, v, do = g.args
    attrs = {"batch": batch, "sizes": [tq, tk, d, dv], "causal": causal,
             "scale": scale if scale is not None else 1 / math.sqrt(d)}
    maps = [m for _, m in bufs]
    fwd = _results(layout, ("o", "lse"), attrs, dtype)
    o, lse = b.create("kernel.attention", [q, k, v], {**attrs, "maps": maps[:3], **fwd}).results
    shapes = logical_shapes(attrs)
    o_lse = fwd.get("out_maps", [_contiguous(shapes["o"]), _contiguous(shapes["lse"])])
    grads = b.create("kernel.attention_grad", [q, k, v, o, lse, do],
                     {**attrs, "maps": maps[:3] + o_lse + [maps[3]],
                      **_results(layout, ("dq", "dk", "dv"), attrs, dtype)})
    b.create("func.return", [o, lse, *grads.results])
    return verify(g)


def inputs(g: Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(a.type.shape).astype(NP[a.type.dtype]) for a in g.args]


def close(got, want, dtype: str, what: str = "", tq: int = 1, tk: int = 1) -> None:
    """Each result within the dtype's tolerance of the reference, its absolute part grown
    with the square root of the sum's length (tk terms per o, lse and dq, tq per dk and
    dv): where the terms cancel (one key: dk is 0) the rounding left is that of the terms."""
    names = ("o", "lse", "dq", "dk", "dv")
    lengths = (tk, tk, tk, tq, tq)
    for name, n, x, y in zip(names, lengths, got, want, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype, (what, name, x.shape, y.shape)
        scale = max(float(np.max(np.abs(y))), 1.0) * np.sqrt(n)
        np.testing.assert_allclose(x, y, rtol=RTOL[dtype], atol=RTOL[dtype] * scale,
                                   err_msg=f"{what}: {name}")


def check(layout, batch, tq, tk, d, dv, causal, dtype, threads, seed=0) -> None:
    g = attention_graph(layout, batch, tq, tk, d, dv, causal, dtype)
    xs = inputs(g, seed)
    got = cpu.Executable(g, threads, use_cache=False)(xs)
    close(got, interpreter.run(g, xs), dtype,
          f"{layout} batch={batch} sizes={[tq, tk, d, dv]} causal={causal} {dtype} "
          f"threads={threads}", tq, tk)


@pytest.fixture
def split(monkeypatch):
    """Split even small kernels across threads (the work threshold is for speed only)."""
    monkeypatch.setattr(cpu_threads, "MIN_WORK", 1)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_interpreter(layout, causal, dtype, threads, split):
    # two query blocks and several key blocks, each with a partial tile at the end
    check(layout, [2, 3], 70, 53, 17, 9, causal, dtype, threads)


@pytest.mark.parametrize("isa", [Isa(256, 16), Isa(128, 16)], ids=["avx2", "sse"])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("causal", [True, False])
def test_narrower_vectors(isa, dtype, causal, split, monkeypatch):
    """The AVX2 (and SSE/NEON) blocking, forced on any host: fewer registers, fewer lanes."""
    monkeypatch.setattr(codegen, "host_isa", lambda: isa)
    check("heads", [2, 2], 37, 70, 16, 20, causal, dtype, 2)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(layout=st.sampled_from(LAYOUTS),
       batch=st.sampled_from([[], [1], [3], [2, 3], [2, 1, 2]]),
       tq=st.sampled_from([1, 3, 16, 17, 65, 130]), tk=st.sampled_from([1, 2, 7, 48, 49, 97]),
       d=st.sampled_from([1, 3, 16, 33]), dv=st.sampled_from([1, 5, 16, 24]),
       causal=st.booleans(), dtype=st.sampled_from(["f32", "f64"]),
       threads=st.sampled_from([1, 2, 3]))
def test_sweep(layout, batch, tq, tk, d, dv, causal, dtype, threads, split):
    if layout.startswith("heads") and len(batch) != 2:
        layout = "contiguous"
    check(layout, batch, tq, tk, d, dv, causal, dtype, threads)


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_finite_differences(causal):
    """dq, dk, dv of sum(o * do) against central differences of the native forward."""
    g = attention_graph("heads", [2, 2], 3, 4, 2, 3, causal, "f64", scale=0.7)
    q, k, v, do = inputs(g, seed=3)
    exe = cpu.Executable(g, 1, use_cache=False)
    _, _, *grads = exe([q, k, v, do])

    def heads(x):  # [B, T, H*D] buffer -> the [B, H, T, D] view the ops read
        b, t, hd = x.shape
        return x.reshape(b, t, 2, hd // 2).transpose(0, 2, 1, 3)

    eps = 1e-6
    for which, grad in enumerate(grads):
        args = [q, k, v]
        numeric = np.zeros_like(args[which])
        for idx in np.ndindex(numeric.shape):
            loss = []
            for sign in (1, -1):
                moved = [a.copy() for a in args]
                moved[which][idx] += sign * eps
                loss.append(float(np.sum(exe([*moved, do])[0] * heads(do))))
            numeric[idx] = (loss[0] - loss[1]) / (2 * eps)
        np.testing.assert_allclose(grad, heads(numeric), rtol=1e-6, atol=1e-8,
                                   err_msg=f"grad {which}")


@pytest.mark.parametrize("causal", [True, False])
def test_out_maps_write_the_transposed_results(causal):
    """With `out_maps` every result is the contiguous one in [B, T, H, ...] order, on the
    cpu and in the interpreter (so the reference does not agree with itself by mistake)."""
    plain, placed = (attention_graph(lay, [2, 3], 19, 13, 5, 7, causal, "f64")
                     for lay in ("heads", "heads_out"))
    xs = inputs(plain)
    want = [np.swapaxes(x, 1, 2) for x in interpreter.run(plain, xs)]
    close(interpreter.run(placed, xs), want, "f64", "interpreter")
    close(cpu.Executable(placed, 2, use_cache=False)(xs), want, "f64", "cpu")


@pytest.mark.parametrize("layout,match", [
    ({"out_maps": [[8, 2, 1], [4, 1]]}, "come together"),
    ({"out_maps": [[8, 2, 1]], "out_types": ["o"]}, "one map per result"),
    ({"out_maps": [[8, 1, 1], [4, 1]], "out_types": ["o", "lse"]}, "does not write every"),
    ({"out_maps": [[9, 2, 1], [4, 1]], "out_types": ["o", "lse"]}, "past its 24 elements"),
])
def test_out_maps_that_do_not_cover_their_buffers_are_refused(layout, match):
    """Each result must be written whole, once per element, inside its type."""
    types = {"o": TensorType((3, 4, 2), "f32"), "lse": TensorType((3, 4), "f32")}
    g = Graph("f", [TensorType((3, 4, 2), "f32")] * 3)
    attrs = {"batch": [3], "sizes": [4, 4, 2, 2], "causal": False, "scale": 1.0,
             "maps": [[8, 2, 1]] * 3, **layout}
    if "out_types" in attrs:
        attrs["out_types"] = [types[n] for n in attrs["out_types"]]
    with pytest.raises(InferenceError, match=match):
        Builder(g.body).create("kernel.attention", list(g.args), attrs)


def test_scores_are_never_stored_whole():
    """Scratch per thread holds blocks, not [Tq, Tk] scores: it stays the same as Tk grows
    (forward) and grows only with the key-row accumulators of one batch element (backward)."""
    def scratch(tk):
        g = attention_graph("heads", [16, 4], 1024, tk, 16, 16, True, "f32")
        fwd, bwd = (op for op in g.ops if op.name.startswith("kernel."))
        return [attention.attention_scratch(op, host_isa(), 1) for op in (fwd, bwd)]

    (f1, b1), (f2, b2) = scratch(1024), scratch(4096)
    assert f1 == f2 < 1024 * 1024 * 4 // 16
    assert b2 - b1 < (4096 - 1024) * 2 * 16 * 4 + 4096
    assert b2 < 1024 * 4096 * 4 // 16


def test_nothing_is_read_past_a_buffer():
    """Under guard pages (in a subprocess, so a fault fails the test, not pytest)."""
    run = subprocess.run([sys.executable, __file__, "guarded"], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr


def _guarded_cases() -> None:
    for layout, batch, sizes, causal in (("heads", [2, 3], [70, 53, 17, 9], True),
                                         ("heads_out", [2, 3], [33, 20, 5, 9], False),
                                         ("transposed", [3], [33, 97, 5, 16], False),
                                         ("broadcast", [2, 2], [17, 49, 3, 24], True),
                                         ("contiguous", [], [1, 7, 1, 1], False)):
        for dtype in ("f32", "f64"):
            g = attention_graph(layout, batch, *sizes, causal, dtype)
            xs = inputs(g)
            with buffers.guarded():
                exe = cpu.Executable(g, 2, use_cache=False)
                got = exe([buffers.guarded_copy(x) for x in xs])
            close(got, interpreter.run(g, xs), dtype, f"guarded {layout} {dtype}")


if __name__ == "__main__" and sys.argv[1:] == ["guarded"]:
    cpu_threads.MIN_WORK = 1
    _guarded_cases()
