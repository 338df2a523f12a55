"""`kernel.attention` and `kernel.attention_grad` on bf16 q, k, v and do (backends/cpu/
attention/amx.py, amx_backward.py: AMX tiles) against the interpreter's float64 attention
of the same bf16 values: within the rounding of the probabilities (and the backward's ds)
to bf16 (2^-9 of each term of o, and of lse's sum; results stored as bf16 are rounded
once more), on odd sizes (partial
query and key blocks, D and Dv not multiples of 16 or 32), the layouts multi-head
attention reads (a [B, T, H*D] projection, transposed operands: element by element), a
partial last query block whose output rows are written element by element, causal or
not, one to three threads. Skipped on a cpu without AMX tiles (the pass that makes these
ops runs only where it has them)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from test_cpu_attention import _buffer, _contiguous

from ember.backends import cpu, interpreter
from ember.backends.cpu.machine.host import host_isa
from ember.backends.cpu.parallel import outline as cpu_threads
from ember.ir import Builder, Graph, TensorType, verify
from ember.ir.dialects.kernel_attention import logical_shapes

pytestmark = pytest.mark.skipif(not host_isa().bf16_tiles, reason="no AMX tiles on this cpu")
EPS = 2.0 ** -7  # four times bf16's rounding of a probability (or a ds), of the largest


def _bf16_results(names, attrs: dict) -> dict:
    """`out_maps` and `out_types` storing every result but lse as bf16 in the [B, T, H, ...]
    layout the projections read (low-precision-attention folds casts so)."""
    shapes = logical_shapes(attrs)
    types, maps = [], []
    for n in names:
        bsz, h, t, *d = shapes[n]
        if n == "lse":
            types.append(TensorType((bsz, h, t), "f32"))
            maps.append(_contiguous(types[-1].shape))
            continue
        types.append(TensorType((bsz, t, h, *d), "bf16"))
        st = _contiguous(types[-1].shape)
        maps.append([st[0], st[2], st[1], *st[3:]])
    return {"out_maps": maps, "out_types": types}


def _graph(layout: str, batch: list[int], tq: int, tk: int, d: int, dv: int,
           causal: bool, bf16_out: bool = False) -> Graph:
    """(q, k, v, do) -> (o, lse, dq, dk, dv), all operands bf16: the forward, and the
    backward from its o and lse; with `bf16_out`, results stored as bf16 (see above)."""
    bufs = [_buffer(layout, batch, tq, d, False), _buffer(layout, batch, tk, d, True),
            _buffer(layout, batch, tk, dv, True), _buffer(layout, batch, tq, dv, False)]
    g = Graph("f", [TensorType(s, "bf16") for s, _ in bufs])
    b = Builder(g.body)
    q, k, v, do = g.args
    attrs = {"batch": batch, "sizes": [tq, tk, d, dv], "causal": causal,
             "scale": 1 / math.sqrt(d)}
    maps = [m for _, m in bufs]
    fwd = _bf16_results(("o", "lse"), attrs) if bf16_out else {}
    o, lse = b.create("kernel.attention", [q, k, v], {**attrs, "maps": maps[:3],
                                                      **fwd}).results
    shapes = logical_shapes(attrs)
    o_lse = fwd.get("out_maps", [_contiguous(shapes["o"]), _contiguous(shapes["lse"])])
    grads = b.create("kernel.attention_grad", [q, k, v, o, lse, do], {
        **attrs, "maps": maps[:3] + o_lse + [maps[3]],
        **(_bf16_results(("dq", "dk", "dv"), attrs) if bf16_out else {})})
    b.create("func.return", [o, lse, *grads.results])
    return verify(g)


@pytest.fixture
def split(monkeypatch):
    monkeypatch.setattr(cpu_threads, "MIN_WORK", 1)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout,batch,sizes,threads", [
    ("contiguous", [4, 3], [256, 256, 64, 64], 2),  # GPT's shape: whole blocks, vectors
    ("heads", [2, 3], [70, 53, 17, 9], 2),          # partial blocks, odd D
    ("heads", [2, 2], [33, 100, 48, 40], 3),        # D, Dv past one 32 (16 x 16 blocks)
    ("transposed", [3], [40, 37, 16, 16], 1),       # operands down their columns
    ("contiguous", [], [5, 3, 2, 1], 1),            # tiny: one partial block of each
    ("bf16_out", [2, 3], [64, 64, 32, 32], 2),      # results stored as bf16, [B, T, H, D]
    ("bf16_out", [2, 2], [33, 40, 24, 17], 1),      # ... element by element
])
def test_matches_interpreter(layout, batch, sizes, threads, causal, split):
    bf16_out = layout == "bf16_out"
    g = _graph("heads" if bf16_out else layout, batch, *sizes, causal, bf16_out)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(a.type.shape).astype(ml_dtypes.bfloat16) for a in g.args]
    got = cpu.Executable(g, threads, use_cache=False)(xs)
    want = interpreter.run(g, xs)
    for name, x, y in zip(("o", "lse", "dq", "dk", "dv"), got, want, strict=True):
        assert x.dtype == y.dtype == (ml_dtypes.bfloat16 if bf16_out and name != "lse"
                                      else np.float32), name
        x, y = x.astype(np.float32), y.astype(np.float32)
        # o is a mean of v's rows (lse a log of a sum); the gradients sums of products
        scale = 1.0 if name == "lse" else max(1.0, float(np.abs(y).max()))
        np.testing.assert_allclose(x, y, rtol=0, atol=EPS * scale, err_msg=name)
