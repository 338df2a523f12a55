"""The CPU's vector exp at the edges of its range: the lanes a causal mask gives it (-inf,
-1e4) are exactly 0 and take the fast path (measured, not asserted: benchmarks/), and
every other argument matches numpy within a few ulp, NaN and overflow included."""

import numpy as np
import pytest

import ember as em
from ember import nn


class Exp(nn.Module):
    def forward(self, x):
        return x.exp(), nn.functional.sigmoid(x)


EDGES = {"f32": [-np.inf, -1e30, -1e4, -104.5, -103.99, -103.97, -100.0, -87.4, -87.3, -20.0,
                 -1.0, -0.0, 0.0, 1e-8, 1.0, 20.0, 88.7, 88.8, 1e4, np.inf, np.nan],
         "f64": [-np.inf, -1e300, -1e4, -746.0, -745.2, -745.1, -740.0, -708.5, -708.0, -1.0,
                 0.0, 1.0, 709.7, 709.8, 1e4, np.inf, np.nan]}


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_exp_and_sigmoid_agree_with_numpy_over_the_whole_range(dtype):
    # several vectors' worth, each edge in every lane
    x = np.array(EDGES[dtype] * 9, {"f32": np.float32, "f64": np.float64}[dtype])
    f = em.compile(Exp(), x, backend="cpu")
    exp, sig = f(x)
    with np.errstate(over="ignore"):
        want_exp, want_sig = np.exp(x), 1 / (1 + np.exp(-x))
    np.testing.assert_array_equal(np.isnan(exp), np.isnan(x))
    np.testing.assert_array_equal(exp == 0, want_exp == 0)  # exactly 0 where numpy's is
    tiny = np.finfo(x.dtype).tiny
    np.testing.assert_allclose(exp, want_exp, rtol=4 * np.finfo(x.dtype).eps, atol=4 * tiny)
    np.testing.assert_allclose(sig, want_sig, rtol=4 * np.finfo(x.dtype).eps, atol=0)
