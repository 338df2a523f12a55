"""bf16 and f16 on the compiled backends, against the interpreter: the cpu (and the cuda
code, through its emulator) only store, move and cast them; `widen-low-precision` runs
every other op in f32 between casts, at the interpreter's rounding points, so the results
are the same bits."""

from __future__ import annotations

import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
from small_models import ToDtype

import ember as em
from ember import nn, optim
from ember.backends import cpu, cuda, interpreter
from ember.backends.cpu.codegen import plan
from ember.backends.cuda import emulate
from ember.backends.errors import UnsupportedOpError
from ember.frontend.trace import TensorSpec, trace_function
from ember.ir import Builder, Graph, TensorType, numpy_dtype
from ember.runtime.pipeline import (
    Stages,
    inference_pipeline,
    training_pipeline,
    with_low_precision,
)

LOW = ("bf16", "f16")
needs_gxx = pytest.mark.skipif(not emulate.available(), reason="the CUDA emulator needs g++")


def casts(n: int) -> Graph:
    """f32 -> bf16 and f16, and back."""
    g = Graph("casts", [TensorType((n,), "f32")])
    b = Builder(g.body)
    low = [b.op("ember.cast", g.args[0], dtype=d) for d in LOW]
    b.create("func.return", low + [b.op("ember.cast", v, dtype="f32") for v in low])
    return g


def awkward_floats(n: int) -> np.ndarray:
    """Random bit patterns (NaNs with payloads, subnormals, huge values), values over f16's
    range down to its subnormals, ties and the edges of both formats."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[: n // 2] = rng.normal(size=n // 2) * np.exp(rng.uniform(-25, 13, n // 2))
    x[:14] = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 65504, 65520, 65519.996,
              3.4e38, 2**-25, 1 + 2**-8, 1 + 3 * 2**-8]
    return x


def same_bits(ours: np.ndarray, want: np.ndarray) -> None:
    """Equal bits, but that any NaN may be any NaN (f16's payload is the hardware's)."""
    assert ours.dtype == want.dtype and ours.shape == want.shape
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(ours.astype(np.float32)), nan)
    u = f"u{want.itemsize}"
    np.testing.assert_array_equal(ours.view(u)[~nan], want.view(u)[~nan])


def emulated(graph: Graph):
    return lambda inputs, params=None: [np.asarray(a) for a in
                                        emulate.EmulatedExecutable(graph)(inputs, params)]


RUNNERS = [pytest.param(cpu.compile, id="cpu"),
           pytest.param(emulated, id="cuda-emulator", marks=needs_gxx)]


@pytest.mark.parametrize("compile_", RUNNERS)
def test_casts_round_to_nearest_even_as_the_interpreter(compile_):
    g, x = casts(4099), awkward_floats(4099)
    want = interpreter.run(g, [x])
    for ours, w in zip(compile_(g)([x]), want):
        same_bits(ours, w)
    bf16 = compile_(g)([x])[0]
    np.testing.assert_array_equal(bf16[:4].view(np.uint16), [0x7FC0, 0xFFC0, 0x7F80, 0xFF80])


def test_arithmetic_on_bf16_without_the_pass_is_refused_not_wrong():
    g = Graph("f", [TensorType((4,), "bf16")] * 2)
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.add", *g.args)])
    for lower in (cpu.compile, cuda.lower):
        with pytest.raises(UnsupportedOpError, match="widen-low-precision"):
            lower(g)


def test_bf16_buffers_take_two_bytes():
    """A bf16 temporary between two unfused kernels takes 2 bytes an element in the arena."""
    g = Graph("f", [TensorType((1024,), "f32")])
    b = Builder(g.body)
    t = b.op("ember.cast", g.args[0], dtype="bf16")
    b.create("func.return", [b.op("ember.cast", b.op("ember.exp", b.op("ember.cast", t,
                                                                       dtype="f32")),
                                  dtype="bf16")])
    p = plan(g)
    assert p.arena == 1024 * 4 + 1024 * 2  # the bf16 temporary and the f32 one
    assert [s.type.nbytes for s in p.slots if s.type.dtype == "bf16"] == [2048, 2048]


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(16, 64), nn.LayerNorm(64), nn.Linear(64, 5)

    def forward(self, x):
        return nn.functional.softmax(self.fc2(self.norm(nn.functional.gelu(self.fc1(x)))), -1)


def model_and_input(dtype: str):
    em.seed(0)
    x = np.random.default_rng(1).normal(size=(8, 16)).astype(numpy_dtype(dtype))
    return Mlp().map(ToDtype(dtype)), x


@pytest.mark.parametrize("dtype", LOW)
def test_an_mlp_forward_on_cpu_equals_the_interpreter_exactly(dtype):
    model, x = model_and_input(dtype)
    ours = em.compile(model, x, backend="cpu")
    want = em.compile(model, x, backend="interpreter")(x)
    assert "widen-low-precision" in ours.stages
    assert want.dtype == numpy_dtype(dtype)
    same_bits(ours(x), want)


@needs_gxx
@pytest.mark.parametrize("dtype", LOW)
def test_the_cuda_code_of_an_mlp_forward_equals_the_interpreter_exactly(dtype):
    model, x = model_and_input(dtype)
    traced = em.trace(model, x)
    graph = Stages(traced, with_low_precision(inference_pipeline(), traced,
                                              cuda.LEGALIZE_LOW_PRECISION)).graph
    params = {str(p.id): p.val() for _, p in model.named_parameters()}
    want = interpreter.run(Stages(em.trace(model, x), inference_pipeline()).graph, [x], params)
    same_bits(emulated(graph)([x], params)[0], want[0])


def test_a_bf16_training_step_on_cpu_equals_the_interpreter_exactly():
    """Adam on bf16 params (its update computed in f32, rounded once), loss and params."""
    y = np.random.default_rng(2).integers(0, 5, 8)
    runs = {}
    for backend in ("interpreter", "cpu"):
        model, x = model_and_input("bf16")
        step = em.compile_train_step(model, lambda out, y: nn.functional.cross_entropy(
            out, y), optim.Adam(lr=1e-2), backend=backend)
        runs[backend] = [step(x, y) for _ in range(4)], [p.val() for p in model.parameters()]
    (losses, params), (want_losses, want_params) = runs["cpu"], runs["interpreter"]
    assert losses == want_losses and want_losses[-1] < want_losses[0]
    for p, w in zip(params, want_params):
        assert p.dtype == ml_dtypes.bfloat16
        same_bits(p, w)


@pytest.mark.slow  # nvcc compiles
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("dtype", LOW)
def test_the_cuda_code_of_a_low_precision_training_step_compiles(dtype, tmp_path):
    """The whole step (forward, backward, Adam in f32 on the bf16/f16 params), widened and
    fused, as one translation unit: nvcc -ptx accepts it without a warning, and so does
    NVRTC (what cupy compiles with) where it loads."""
    model, x = model_and_input(dtype)
    traced = trace_function(lambda x, y: nn.functional.cross_entropy(model(x), y), model,
                            (TensorSpec(x.shape, dtype), TensorSpec((8,), "i64")),
                            name="step", training=True)
    pipeline = training_pipeline(optim.Adam(lr=1e-3).pass_spec())
    graph = Stages(traced, with_low_precision(pipeline, traced, cuda.LEGALIZE_LOW_PRECISION)
                   ).graph
    (tmp_path / "k.cu").write_text(cuda.emit_cuda(graph))
    r = subprocess.run(["nvcc", "-ptx", "-arch=sm_90", str(tmp_path / "k.cu"), "-o",
                        str(tmp_path / "k.ptx")], capture_output=True, text=True)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr[-3000:]
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception:  # noqa: BLE001  (no cupy, or no libnvrtc: nvcc's check is enough)
        return
    assert cuda.compile_ptx(graph).count(".entry") == len(cuda.lower(graph).kernels)
