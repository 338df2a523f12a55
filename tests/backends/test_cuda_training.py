"""Training through the CUDA backend: on the CPU emulator (a few steps against the
interpreter, through the runtime exactly as `backend="cuda"` runs), and on a GPU when there
is one (the digits MLP and CNN reach 97%)."""

from __future__ import annotations

import io
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.backends import cuda
from ember.backends.cuda import emulate
from ember.backends.cuda.program import Gemm
from ember.runtime.data import digits
from ember.runtime.models import Cnn, Mlp

try:
    cuda.check_available()
    GPU_REASON = None
except cuda.CudaUnavailableError as e:
    GPU_REASON = f"no usable GPU here: {e}"
needs_gpu = pytest.mark.skipif(GPU_REASON is not None, reason=GPU_REASON or "")
needs_emulator = pytest.mark.skipif(not emulate.available(), reason="the emulator needs g++")


@pytest.fixture
def emulated_cuda(monkeypatch):
    """backend="cuda" runs on the CPU emulator (the runtime still treats it as a device)."""
    from ember.runtime import compiled

    real = compiled.get_backend
    fake = types.SimpleNamespace(compile=lambda graph: emulate.EmulatedExecutable(graph),
                                 LEGALIZE_LOW_PRECISION=cuda.LEGALIZE_LOW_PRECISION)
    monkeypatch.setattr(compiled, "get_backend",
                        lambda name: fake if name == "cuda" else real(name))


def _steps(make_model, backend, data, n, opt):
    em.seed(0)
    model = make_model()
    step = em.compile_train_step(model, nn.functional.cross_entropy, opt, backend=backend)
    losses = [step(data[0][i * 16:(i + 1) * 16], data[1][i * 16:(i + 1) * 16])
              for i in range(n)]
    return losses, {k: np.asarray(p.val()) for k, p in model.named_parameters()}


@needs_emulator
@pytest.mark.parametrize("make_model,image,opt", [
    (Mlp, False, lambda: optim.Adam(lr=1e-2)),
    (Cnn, True, lambda: optim.SGD(lr=0.05, momentum=0.9))], ids=["mlp", "cnn"])
def test_emulated_cuda_steps_equal_the_interpreter(emulated_cuda, make_model, image, opt):
    d = digits(seed=0, image=image)
    data = (d.x_train[:64], d.y_train[:64])
    got_losses, got = _steps(make_model, "cuda", data, 4, opt())
    want_losses, want = _steps(make_model, "interpreter", data, 4, opt())
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-4)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


def _gpt_runs(precision: str, overflow: bool):
    """Three GPT steps on backend "cuda" (the emulator under `emulated_cuda`) and on the
    interpreter in `precision`, the last (with `overflow`) under a loss scale that
    overflows the f16 backward."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from gpt import Gpt, batches, lm_loss

    runs = []
    for backend in ("cuda", "interpreter"):
        em.seed(0)
        step = em.compile_train_step(Gpt(vocab=17, n_embd=16, n_head=2, n_layer=1, block=8),
                                     lm_loss, optim.AdamW(lr=1e-2), backend=backend,
                                     precision=precision)
        data = batches(17, 4, 8, 3)
        losses = [step(x, y) for x, y in data[:2]]
        if overflow:
            step.scaler.scale = 2.0 ** 40
        losses.append(step(*data[2]))
        runs.append((losses, step))
    return runs


@needs_emulator
def test_emulated_cuda_16_mixed_steps_equal_the_interpreter(emulated_cuda):
    """f16 matmuls (cuBLAS's Ex call) and attention between casts, loss scaling, and a
    skipped step."""
    (got, step), (want, ref) = _gpt_runs("16-mixed", overflow=True)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    for s in (step, ref):
        assert (s.skipped, s.optimizer.step_count, s.scaler.scale) == (True, 2, 2.0 ** 39)


@needs_emulator
def test_emulated_cuda_bf16_mixed_steps_equal_the_interpreter(emulated_cuda):
    """bf16 values held, moved and cast on the device; every Linear's matmuls (forward and
    both gradients) are cuBLAS Ex calls on the bf16 values with f32 sums."""
    (got, step), (want, _) = _gpt_runs("bf16-mixed", overflow=False)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    gemms = [s for s in cuda.lower(step.graph).steps if isinstance(s, Gemm)]
    ex = [s.ex for s in gemms if s.ex is not None]
    assert {(e.a.dtype, e.b.dtype, e.c.dtype) for e in ex} == {("bf16", "bf16", "f32")}
    assert len(ex) == 7 * 3  # 7 Linears (q, k, v, out, fc, proj, head): the forward, the
    #                           input's and the weight's gradients


@needs_gpu
def test_bf16_mixed_steps_on_the_gpu_equal_the_interpreter():
    """cuBLAS's tensor-core sums differ from numpy's in order only: the losses agree to
    bf16's rounding of what the sums feed."""
    (got, _), (want, _) = _gpt_runs("bf16-mixed", overflow=False)
    np.testing.assert_allclose(got, want, rtol=2e-3)


def _fit(model, data, backend):
    from ember.runtime.train import fit

    return fit(model, data, optim.Adam(lr=optim.Cosine(1e-2, total_steps=440)), epochs=10,
               backend=backend, progress=False, out=io.StringIO())


@needs_gpu
def test_digits_mlp_reaches_97_percent_on_the_gpu():
    em.seed(0)
    results = _fit(Mlp(), digits(seed=0), "cuda")
    assert results[-1].test_accuracy >= 0.97, results[-1]


@needs_gpu
def test_digits_cnn_reaches_97_percent_on_the_gpu():
    em.seed(0)
    results = _fit(Cnn(), digits(seed=0, image=True), "cuda")
    assert results[-1].test_accuracy >= 0.97, results[-1]


@needs_gpu
def test_gpu_executable_takes_numpy_or_cupy_and_returns_device_arrays():
    import cupy

    from ember.ir import Builder, Graph, TensorType

    g = Graph("f", [TensorType((3, 4), "f32"), TensorType((4,), "f32")])
    b = Builder(g.body)
    s = b.op("ember.add", *g.args)
    b.create("func.return", [s, g.args[0], s])
    exe = cuda.compile(g)
    x, y = np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(4, np.float32)
    for args in ([x, y], [cupy.asarray(x), cupy.asarray(y)], [cupy.asarray(x.T).T, y]):
        outs = exe(args, {})
        assert all(isinstance(o, cupy.ndarray) for o in outs)
        np.testing.assert_array_equal(outs[0].get(), x + y)
        np.testing.assert_array_equal(outs[1].get(), x)
        assert outs[0].data.ptr != outs[2].data.ptr  # each result is the caller's own
    with pytest.raises(ValueError, match=r"input 1.*expected shape \[4\]"):
        exe([x, np.ones(5, np.float32)], {})


@needs_gpu
def test_a_scalar_input_is_uploaded_again_only_when_it_changes():
    from ember.ir import Builder, Graph, TensorType

    g = Graph("f", [TensorType((3,), "f32"), TensorType((), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.mul", *g.args)])
    exe = cuda.compile(g)
    x = np.arange(3, dtype=np.float32)
    for lr in (0.5, 0.5, np.float32(0.5), 2.0, np.array(2.0)):
        np.testing.assert_array_equal(exe([x, np.asarray(lr, np.float32)])[0].get(), x * lr)
    assert [held.get() for _, held in exe._scalars.values()] == [2.0]  # one upload kept


@needs_gpu
def test_a_gpu_step_leaves_params_on_the_device_and_equal_to_the_cpus():
    """No param is copied back per step: each holds the device array the step returned
    (fed to the next step as it is) until `val()` reads it; values equal the cpu's."""
    import cupy

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 64)).astype(np.float32), rng.integers(0, 10, 32)
    models = {}
    for backend in ("cuda", "cpu"):
        em.seed(0)
        models[backend] = Mlp()
        step = em.compile_train_step(models[backend], nn.functional.cross_entropy,
                                     optim.Adam(lr=1e-2), backend=backend)
        for _ in range(3):
            step(x, y)
    gpu, cpu = (dict(models[b].named_parameters()) for b in ("cuda", "cpu"))
    assert all(isinstance(p.device_value(), cupy.ndarray) for p in gpu.values())
    for path, p in gpu.items():
        np.testing.assert_allclose(p.val(), cpu[path].val(), rtol=1e-4, atol=1e-5, err_msg=path)


@needs_gpu
def test_gpu_memory_is_the_planned_arena():
    """Compiling allocates the planned arena and the constants from cupy's pool, no more
    (within 10%), and a step allocates only its inputs, params and results."""
    import cupy

    from ember.frontend.trace import TensorSpec, trace_function
    from ember.runtime.pipeline import Stages, training_pipeline

    em.seed(0)
    model = Mlp()
    g = trace_function(lambda x, y: nn.functional.cross_entropy(model(x), y), model,
                       (TensorSpec((64, 64), "f32"), TensorSpec((64,), "i64")), training=True)
    graph = Stages(g, training_pipeline(optim.Adam(lr=1e-3).pass_spec())).graph
    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    exe = cuda.compile(graph)
    report = exe.memory_report()
    planned = report["arena_bytes"] + report["constants"]
    assert abs(pool.used_bytes() - before - planned) <= 0.1 * planned + 512 * (
        1 + sum(s.kind == "const" for s in exe.program.slots))


class _WideHeadAttention(nn.Module):
    """softmax(q k^T / sqrt(d)) v with a head dim no cuda attention tiling takes in f64."""

    def forward(self, q, k, v):
        scores = (q @ k.transpose((0, 1, 3, 2))) * (1.0 / np.sqrt(q.shape[-1]))
        return nn.functional.softmax(scores, axis=-1) @ v


@needs_emulator
def test_attention_the_cuda_backend_cannot_tile_runs_unfused(emulated_cuda, capsys):
    q, k, v = (np.random.default_rng(i).standard_normal((1, 1, 8, 1024)) for i in range(3))
    model = _WideHeadAttention()
    fwd = em.compile(model, q, k, v, backend="cuda")
    want = em.compile(model, q, k, v, backend="interpreter")(q, k, v)
    np.testing.assert_allclose(np.asarray(fwd(q, k, v)), want, rtol=1e-12, atol=1e-12)
    assert "compiling with fuse{attention=false}" in capsys.readouterr().err
    assert "kernel.attention" not in fwd.ir()
    assert "kernel.attention" in em.compile(model, q, k, v, backend="interpreter").ir()
