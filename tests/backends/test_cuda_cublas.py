"""The cuBLAS calls the cuda backend plans for bf16/f16 GEMMs (backends/cuda/cublas.py),
run by the emulator on cuBLAS's own column-major terms, against numpy's matmul of the
row-major views they were planned from; and a bf16 Linear through the emulator and, where
there is one, the GPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.backends import cuda
from ember.backends.cuda import cublas, emulate
from ember.backends.cuda.emulate import _gemm_ex
from ember.backends.cuda.program import View
from ember.backends.interpreter import run as interpret
from ember.ir import Builder, Graph, TensorType
from ember.runtime.backend import to_host

try:
    cuda.check_available()
    GPU_REASON = None
except cuda.CudaUnavailableError as e:
    GPU_REASON = f"no usable GPU here: {e}"

BF16 = ("bf16", "bf16", "f32")


def _operand(rng, slot: int, shape: tuple[int, ...], perm: tuple[int, ...]):
    """A bf16 array of `shape` stored in the axis order `perm`: (logical values, memory,
    the row-major view of the memory)."""
    values = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    memory = np.ascontiguousarray(values.transpose(perm))
    mem_strides = [s // memory.itemsize for s in memory.strides]
    strides = tuple(mem_strides[perm.index(d)] for d in range(len(shape)))
    return values, memory, View(slot, shape, strides)


def _run(ex: cublas.GemmEx, memories, out_shape):
    arrays = [*memories, np.full(out_shape, np.nan, np.float32)]
    _gemm_ex(ex, arrays)
    return arrays[2]


@st.composite
def gemms(draw):
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    M, N, K = (draw(st.integers(1, 5)) for _ in range(3))
    shapes = []
    for inner in ((M, K), (K, N)):
        keep = draw(st.integers(0, len(batch)))  # fewer batch dims: broadcast
        own = tuple(draw(st.sampled_from([d, 1])) for d in batch[len(batch) - keep:])
        shape = (*own, *inner)
        shapes.append((shape, tuple(draw(st.permutations(range(len(shape)))))))
    return batch, (M, N), shapes, draw(st.integers(0, 2 ** 32 - 1))


@settings(max_examples=300, deadline=None)
@given(gemms())
def test_a_planned_call_computes_the_views_product(case):
    """Any layout: transposed, batch dims permuted or broadcast. A view the plan refuses
    is planned once it is copied contiguous at the result's batch, as codegen does."""
    batch, (M, N), shapes, seed = case
    rng = np.random.default_rng(seed)
    (a, a_mem, a_view), (b, b_mem, b_view) = (_operand(rng, i, *s) for i, s in enumerate(shapes))
    out_shape = (*batch, M, N)
    out = View(2, out_shape, tuple(int(np.prod(out_shape[i + 1:])) for i in range(len(out_shape))))
    ex = cublas.plan(out, a_view, b_view, BF16)
    if ex is None:
        a_mem, b_mem = (np.ascontiguousarray(np.broadcast_to(v, (*batch, *v.shape[-2:])))
                        for v in (a, b))
        a_view, b_view = (View(i, v.shape, tuple(s // v.itemsize for s in v.strides))
                          for i, v in enumerate((a_mem, b_mem)))
        ex = cublas.plan(out, a_view, b_view, BF16)
    assert ex is not None
    want = np.broadcast_to(np.matmul(a.astype(np.float64), b.astype(np.float64)), out_shape)
    np.testing.assert_allclose(_run(ex, [a_mem, b_mem], out_shape), want, rtol=1e-5, atol=1e-5)


def test_a_linear_and_its_gradients_read_their_operands_in_place():
    """x @ w^T, dy @ w and x^T @ dy (a Linear's forward and backward) are one call each,
    the transposes cuBLAS's `op`."""
    x, w, dy = (View(i, s, (s[1], 1)) for i, s in enumerate([(6, 4), (3, 4), (6, 3)]))
    w_t = View(1, (4, 3), (1, 4))
    x_t = View(0, (4, 6), (1, 4))
    for a, b, (M, N) in ((x, w_t, (6, 3)), (dy, w, (6, 4)), (x_t, dy, (4, 3))):
        ex = cublas.plan(View(3, (M, N), (N, 1)), a, b, BF16)
        assert ex is not None and ex.batch == 1 and (ex.m, ex.n) == (N, M)
    ex = cublas.plan(View(3, (6, 3), (3, 1)), x, w_t, BF16)
    assert (ex.a.op, ex.b.op, ex.a.ld, ex.b.ld, ex.c.ld) == (cublas.OP_T, cublas.OP_N, 4, 4, 3)


def test_a_batch_against_one_matrix_is_one_strided_call():
    a = View(0, (2, 3, 5, 4), (60, 20, 4, 1))
    b = View(1, (4, 6), (6, 1))
    ex = cublas.plan(View(2, (2, 3, 5, 6), (90, 30, 6, 1)), a, b, BF16)
    assert (ex.batch, ex.a.stride, ex.b.stride, ex.c.stride) == (6, 0, 20, 30)


def test_permuted_batch_dims_need_a_copy():
    a = View(0, (2, 3, 5, 4), (20, 40, 4, 1))  # [3, 2, 5, 4] in memory
    b = View(1, (2, 3, 4, 6), (72, 24, 6, 1))
    assert cublas.plan(View(2, (2, 3, 5, 6), (90, 30, 6, 1)), a, b, BF16) is None


@pytest.mark.parametrize("dtypes,ex", [(("bf16", "bf16", "f32"), True),
                                       (("f16", "f16", "f32"), True),
                                       (("f32", "f32", "f32"), False),
                                       (("f16", "f16", "f16"), False),
                                       (("bf16", "f16", "f32"), False)])
def test_which_gemms_take_the_ex_call(dtypes, ex):
    assert cublas.low_precision(dtypes) is ex


def _linear_graph():
    """y = x @ w^T in bf16 with f32 sums, y rounded to bf16, and x returned as given."""
    g = Graph("f", [TensorType((5, 8), "bf16"), TensorType((6, 8), "bf16")])
    b = Builder(g.body)
    y = b.op("ember.matmul", g.args[0], b.op("ember.transpose", g.args[1], perm=[1, 0]),
             dtype="f32")
    b.create("func.return", [y, b.op("ember.cast", y, dtype="bf16"), g.args[0]])
    rng = np.random.default_rng(0)
    return g, [rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in ((5, 8), (6, 8))]


@pytest.mark.skipif(not emulate.available(), reason="the emulator needs g++")
def test_a_bf16_linear_on_the_emulator_equals_the_interpreter():
    g, inputs = _linear_graph()
    assert [type(s).__name__ for s in cuda.lower(g).steps] == ["Gemm", "Launch"]
    got = emulate.EmulatedExecutable(g)(inputs)
    want = interpret(g, inputs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    for k in (1, 2):
        assert got[k].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got[k].view(np.uint16), want[k].view(np.uint16))


@pytest.mark.skipif(not emulate.available(), reason="the emulator needs g++")
def test_a_batch_that_broadcasts_both_ways_is_copied_first():
    """[2, 1] rows of A against [3] of B: no one batch stride reads either, so both go
    through a contiguous copy (a map kernel) at the result's batch."""
    g = Graph("f", [TensorType((2, 1, 5, 4), "bf16"), TensorType((3, 4, 6), "bf16")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.matmul", *g.args, dtype="f32")])
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(t.shape).astype(ml_dtypes.bfloat16)
              for t in (a.type for a in g.args)]
    steps = cuda.lower(g).steps
    assert [type(s).__name__ for s in steps] == ["Launch", "Launch", "Gemm"]
    assert steps[-1].ex.batch == 6
    got = emulate.EmulatedExecutable(g)(inputs)[0]
    np.testing.assert_allclose(got, interpret(g, inputs)[0], rtol=1e-6)
    if _nvrtc_loads():  # the bf16 copy kernels as the GPU's compiler takes them
        assert cuda.compile_ptx(g).count(".entry") == 2


def _nvrtc_loads() -> bool:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception:  # noqa: BLE001  (no cupy, or no libnvrtc)
        return False
    return True


@pytest.mark.skipif(GPU_REASON is not None, reason=GPU_REASON or "")
def test_a_bf16_linear_on_the_gpu_equals_the_emulator():
    """bf16 crosses the device boundary as its bits (cupy uint16), `to_host` gives it back
    as bfloat16; cuBLAS's f32 sums agree with numpy's to f32 rounding."""
    import cupy

    g, inputs = _linear_graph()
    exe = cuda.compile(g)
    got = [to_host(o) for o in exe(inputs)]
    want = interpret(g, inputs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1].astype(np.float32), want[1].astype(np.float32),
                               rtol=2 ** -8)
    np.testing.assert_array_equal(got[2].view(np.uint16), inputs[0].view(np.uint16))
    assert got[1].dtype == ml_dtypes.bfloat16
    device = exe([cupy.asarray(inputs[0].view(np.uint16)), inputs[1]])  # bits on the device
    np.testing.assert_array_equal(device[0].get(), exe(inputs)[0].get())
    with pytest.raises(TypeError, match="bits"):
        exe([cupy.asarray(inputs[0].astype(np.float32)), inputs[1]])
