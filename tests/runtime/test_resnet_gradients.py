"""ResNet-18's parameter gradients at 224x224 against float64, both stems, with each GEMM
engine and thread count: every gradient within 10x of PyTorch float32's own error on the
same tensor (the model exported by PyTorch to ONNX and imported, as users bring one), and,
without PyTorch, the cpu backend against the interpreter running the model in float64.

The networks are smooth (SiLU, an average-pooling stem; see tests/resnet18.py): with ReLU
and max pooling a decision that float32 rounding flips moves a whole channel's gradient,
in PyTorch float32 as in ember, which a test of the arithmetic must not mistake for it.
Marked slow; the whole matrix of stems, batches, engines and threads (each combination
once) runs with EMBER_TEST_HEAVY=1."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from resnet18 import ResNet18, randomize_norms, torch_resnet18

import ember as em
from ember import nn

F = nn.functional


pytestmark = pytest.mark.slow  # full-size models: ~5 s a case
HEAVY = os.environ.get("EMBER_TEST_HEAVY") == "1"


def _cases(cases, heavy=()):
    """`cases`, then the `heavy` ones (the rest of the matrix: about 4 more minutes on 2
    cores, the CIFAR stem at 224x224 being 27 GFLOP an image) with EMBER_TEST_HEAVY=1."""
    return [*cases, *(c for c in heavy if HEAVY and c not in cases)]


# (stem, batch, EMBER_GEMM, EMBER_NUM_THREADS): "" is the automatic choice / every CPU.
# By default each stem, each engine and each thread count once (the kernel sweep in
# tests/backends/test_cpu_accuracy.py covers every engine and split at these sizes).
CASES = _cases(
    [("imagenet", 2, "own", "1"), ("cifar", 1, "blas", "2")],
    [(stem, batch, engine, threads) for stem, batch in (("imagenet", 1), ("imagenet", 2),
                                                        ("imagenet", 8),
                                                        ("cifar", 1), ("cifar", 8))
     for engine in ("own", "blas") for threads in ("1", "2")])


def _env(monkeypatch, engine: str, threads: str) -> None:
    for name, value in (("EMBER_GEMM", engine), ("EMBER_NUM_THREADS", threads)):
        if value:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)


# an error this small relative to a gradient's largest element is a few f32 roundings,
# whatever PyTorch's happens to be on that tensor (its order of summation varies with its
# threads: 7.6e-8 on a BatchNorm weight in one run, ember's 8.2e-7 then 10.8x it)
F32_FLOOR = 2.0 ** -20


def _relative(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


@functools.cache
def torch_reference(stem: str, batch: int):
    """(ONNX file, x, y, {name: float64 gradient}, {name: float32 gradient}) of a PyTorch
    ResNet-18 laid out as tests/resnet18.py's, norms randomized, in eval mode."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    tnn = torch.nn
    gen = torch.Generator().manual_seed(0)
    net = torch_resnet18(stem).eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, tnn.BatchNorm2d):
                for t, lo, hi in ((m.weight, .5, 1.5), (m.bias, -.2, .2),
                                  (m.running_mean, -.2, .2), (m.running_var, .5, 1.5)):
                    t.uniform_(lo, hi, generator=gen)
    x = torch.randn(batch, 3, 224, 224, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    path = Path(tempfile.mkdtemp(prefix="ember-resnet-")) / "resnet18.onnx"
    torch.onnx.export(net, (x,), str(path), dynamo=False, opset_version=17,
                      do_constant_folding=False)
    grads = {}
    for dtype in (torch.float64, torch.float32):
        model = torch_resnet18(stem).eval()
        model.load_state_dict(net.state_dict())
        model.to(dtype)
        tnn.functional.cross_entropy(model(x.to(dtype)), y).backward()
        grads[dtype] = {n: p.grad.double().numpy() for n, p in model.named_parameters()}
    return path, x.numpy(), y.numpy(), grads[torch.float64], grads[torch.float32]


@pytest.mark.parametrize("stem, batch, engine, threads", CASES)
def test_imported_resnet18_gradients_are_as_accurate_as_pytorchs(stem, batch, engine,
                                                                   threads, monkeypatch):
    path, x, y, want, theirs = torch_reference(stem, batch)
    _env(monkeypatch, engine, threads)
    model = em.onnx.load(path)
    grads = em.compile_grad(model, F.cross_entropy, backend="cpu")(x, y)
    params = dict(model.named_parameters())
    worse = []
    for name, ref in want.items():
        ours = _relative(grads[params["initializers." + name].id], ref)
        if ours > max(10 * _relative(theirs[name], ref), F32_FLOOR):
            worse.append(f"{name}: {ours:.2e} (PyTorch f32 {_relative(theirs[name], ref):.2e})")
    assert not worse, "gradients off float64 by over 10x PyTorch f32's error:\n" + \
        "\n".join(worse)


@functools.cache
def interpreter_reference(stem: str, batch: int):
    """(model, x, y, {ParamId: float64 gradient}) of tests/resnet18.py's ResNet-18, its
    params and inputs in float64, on the interpreter."""

    class ToF64(em.ModuleMapper):
        def map_float(self, p):
            return p.map(lambda a: np.asarray(a, np.float64))

        map_buffer = map_float

    em.seed(0)
    model = randomize_norms(ResNet18(stem))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    wide = model.clone().map(ToF64())
    grads = em.compile_grad(wide, F.cross_entropy, backend="interpreter")(
        x.astype(np.float64), y)
    return model, x, y, dict(grads.items())


# the largest error seen on these models (2.2e-6, ImageNet stem, batch 8), with room for
# another machine's kernels; PyTorch float32's own reaches 8.4e-6 on the same models
TORCH_FREE_BOUND = 2e-5


@pytest.mark.parametrize("stem, batch, engine, threads", _cases(
    [("imagenet", 1, "", "")],
    [("imagenet", 8, "own", "2"), ("imagenet", 8, "blas", "1"), ("cifar", 1, "own", "2"),
     ("cifar", 1, "blas", "1")]))
def test_resnet18_gradients_match_the_float64_interpreter(stem, batch, engine, threads,
                                                          monkeypatch):
    model, x, y, want = interpreter_reference(stem, batch)
    _env(monkeypatch, engine, threads)
    grads = em.compile_grad(model, F.cross_entropy, backend="cpu")(x, y)
    errors = {path: _relative(grads[p.id], want[p.id])
              for path, p in model.named_parameters()}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TORCH_FREE_BOUND, f"{worst}: {errors[worst]:.2e} off float64"
