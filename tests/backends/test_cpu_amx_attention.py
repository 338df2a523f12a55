"""`kernel.attention` on bf16 q, k and v (backends/cpu/attention/amx.py: AMX tiles) against
the interpreter's float64 attention of the same bf16 values: within the rounding of the
probabilities to bf16 (2^-9 of each term of o, and of lse's sum), on odd sizes (partial
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
from test_cpu_attention import _buffer

from ember.backends import cpu, interpreter
from ember.backends.cpu.machine.host import host_isa
from ember.backends.cpu.parallel import outline as cpu_threads
from ember.ir import Builder, Graph, TensorType, verify

pytestmark = pytest.mark.skipif(not host_isa().bf16_tiles, reason="no AMX tiles on this cpu")
EPS = 2.0 ** -8  # twice bf16's rounding of a probability


def _graph(layout: str, batch: list[int], tq: int, tk: int, d: int, dv: int,
           causal: bool) -> Graph:
    bufs = [_buffer(layout, batch, tq, d, False), _buffer(layout, batch, tk, d, True),
            _buffer(layout, batch, tk, dv, True)]
    g = Graph("f", [TensorType(s, "bf16") for s, _ in bufs])
    attrs = {"batch": batch, "sizes": [tq, tk, d, dv], "causal": causal,
             "scale": 1 / math.sqrt(d), "maps": [m for _, m in bufs]}
    results = Builder(g.body).create("kernel.attention", list(g.args), attrs).results
    Builder(g.body).create("func.return", list(results))
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
])
def test_matches_interpreter(layout, batch, sizes, threads, causal, split):
    g = _graph(layout, batch, *sizes, causal)
    assert g.args[0].type.dtype == "bf16"
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(a.type.shape).astype(ml_dtypes.bfloat16) for a in g.args]
    o, lse = cpu.Executable(g, threads, use_cache=False)(xs)
    want_o, want_lse = interpreter.run(g, xs)
    assert o.dtype == lse.dtype == np.float32
    vmax = float(np.abs(xs[2].astype(np.float32)).max())
    np.testing.assert_allclose(o, want_o, rtol=0, atol=EPS * vmax)
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=EPS)
