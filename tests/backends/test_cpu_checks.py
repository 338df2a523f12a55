"""The native input checks (backends/cpu/call/input_checks.py) on inputs large enough that
each thread scans a slice of its own: a bad element is found wherever it is, in the first slice, the
last one or at the seam, and a clean batch passes."""

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.backends.cpu.call.input_checks import PARALLEL_SCAN

ROWS = PARALLEL_SCAN + 7  # an odd size: the slices are uneven


def make():
    em.seed(0)
    step = em.compile_train_step(nn.Linear(1, 3), nn.functional.cross_entropy,
                                 optim.SGD(lr=0.1), backend="cpu")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 1)).astype(np.float32)
    return step, x, rng.integers(0, 3, ROWS)


@pytest.mark.parametrize("row", [0, ROWS // 2 - 1, ROWS // 2, ROWS - 1])
def test_a_non_finite_input_is_found_in_any_slice(row):
    step, x, y = make()
    step(x, y)
    assert step._last.native_checks
    x[row, 0] = np.inf if row % 2 else np.nan
    with pytest.raises(ValueError, match=rf"input 0 contains NaN or Inf \(rows \[{row}\]\)"):
        step(x, y)
    x[row, 0] = 0.5
    step(x, y)  # clean again


@pytest.mark.parametrize("row", [0, ROWS // 2, ROWS - 1])
def test_an_out_of_range_label_is_found_in_any_slice(row):
    step, x, y = make()
    y[row] = 3
    with pytest.raises(ValueError, match=r"labels out of range: input 1 has values \[3\]"):
        step(x, y)
