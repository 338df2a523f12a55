"""The cuda Executable's host code (availability check, module load, arena, binding,
launches, GEMMs, results) run against a stand-in for cupy: numpy arrays for device
arrays, the CPU emulator for RawModule. It checks ember's side of the cupy calls, not
cupy itself (that is the GPU tests' job)."""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest

from ember.backends import cuda, interpreter
from ember.backends.cuda import emulate
from ember.ir import Builder, Graph, TensorType

pytestmark = pytest.mark.skipif(not emulate.available(), reason="the emulator needs g++")


class FakeArray(np.ndarray):
    """A numpy array with the bits of cupy.ndarray the executable touches."""

    @property
    def data(self):
        ptr = self.ctypes.data
        return types.SimpleNamespace(ptr=ptr, memset_async=lambda v, n: ctypes.memset(ptr, v, n))

    def get(self):
        return np.array(self)

    def copy(self, order="C"):
        out = empty(self.shape, self.dtype)
        out[...] = self
        return out


def empty(shape, dtype=np.float32):
    return emulate.aligned_empty(shape, dtype).view(FakeArray)


def asarray(x, dtype=None):
    if isinstance(x, FakeArray) and (dtype is None or x.dtype == dtype):
        return x
    a = np.asarray(x, dtype=dtype)
    out = empty(a.shape, a.dtype)
    out[...] = a
    return out


class FakeKernel:
    def __init__(self, lib, name):
        self.lib, self.fn = lib, ctypes.cast(getattr(lib, f"emu_{name}"), ctypes.c_void_p)
        self.calls = 0

    def __call__(self, grid, block, args, shared_mem=0):
        assert len(grid) == len(block) == 3 and shared_mem <= 1 << 16
        assert all(isinstance(a, FakeArray) for a in args), [type(a) for a in args]
        ptrs = (ctypes.c_void_p * max(len(args), 1))(*[a.data.ptr for a in args])
        assert self.lib.emu_launch(self.fn, ptrs, *grid, *block, 0) == 0
        self.calls += 1


class FakeRawModule:
    compiled = 0

    def __init__(self, code, options=()):
        self.code, self.options, self.lib = code, options, None

    def compile(self):
        self.lib = emulate.build(self.code)
        FakeRawModule.compiled += 1

    def get_function(self, name):
        assert self.lib is not None, "get_function before compile"
        return FakeKernel(self.lib, name)


class FakeDevice:
    def __init__(self, i):
        self.id, self.attributes = i, {"MultiProcessorCount": 2}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def fake_cupy(monkeypatch):
    cp = types.ModuleType("cupy")
    cp.__version__ = "fake"
    cp.asarray, cp.empty = asarray, empty
    cp.matmul = lambda a, b, out=None: np.matmul(a, b, out=out)
    cp.RawModule = FakeRawModule
    strided = lambda x, shape, strides: np.lib.stride_tricks.as_strided(  # noqa: E731
        x, shape, strides).view(FakeArray)
    cp.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=strided))
    cp.cuda = types.SimpleNamespace(
        Device=FakeDevice, runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
        nvrtc=types.SimpleNamespace(getVersion=lambda: (12, 9)),
        compiler=types.SimpleNamespace(CompileException=type("CompileException",
                                                              (Exception,), {})))
    monkeypatch.setitem(sys.modules, "cupy", cp)
    for name in ("cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs",
                 "cupy_backends.cuda.libs.cublas"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    from ember.backends.cuda import executable

    monkeypatch.setattr(executable, "_MODULES", {})
    return cp


def test_every_op_through_the_executable(fake_cupy):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    try:
        import test_cuda_ops
    finally:
        sys.path.pop(0)
    for fused in (False, True):
        g, inputs, _ = test_cuda_ops.combined(fused)
        with np.errstate(all="ignore"):
            want = interpreter.run(g, inputs)
        got = cuda.compile(g)(inputs, {})
        assert len(got) == len(want)
        for k, (x, y) in enumerate(zip(got, want)):
            assert isinstance(x, FakeArray) and x.shape == y.shape and x.dtype == y.dtype
            assert np.allclose(x.get(), y, rtol=1e-5, atol=1e-5, equal_nan=True), k


def test_executable_binding_results_and_errors(fake_cupy):
    g = Graph("f", [TensorType((3, 4), "f32"), TensorType((4,), "f32")])
    b = Builder(g.body)
    w = b.create("ember.param", [], {"id": "w0", "path": "fc.w"}, [TensorType((4, 4), "f32")])
    s = b.op("ember.add", b.op("ember.matmul", g.args[0], w.result), g.args[1])
    b.create("func.return", [s, g.args[0], s, b.op("ember.reshape", s, shape=[12])])
    exe = cuda.compile(g, "cuda:0")
    assert FakeRawModule.compiled >= 1 and exe.memory_report()["params"] == 64
    x, y, wv = np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(4, np.float32), \
        np.eye(4, dtype=np.float32)
    for args in ([x, y], [asarray(x), asarray(y)], [x.T.copy().T, y.astype(np.float64)]):
        outs = exe(args, {"w0": wv})
        np.testing.assert_array_equal(outs[0].get(), x + y)
        np.testing.assert_array_equal(outs[1].get(), x)
        np.testing.assert_array_equal(outs[3].get(), (x + y).reshape(12))
        assert len({o.data.ptr for o in outs}) == 4  # each result is the caller's own
    first = exe([x, y], {"w0": wv})[0]
    exe([x + 1, y], {"w0": wv})
    np.testing.assert_array_equal(first.get(), x + y)  # not overwritten by the next call
    with pytest.raises(ValueError, match=r"input 1.*expected shape \[4\]"):
        exe([x, np.ones(5, np.float32)], {"w0": wv})
    with pytest.raises(KeyError, match="no value for param fc.w"):
        exe([x, y], {})
    with pytest.raises(ValueError, match="takes 2 inputs"):
        exe([x], {"w0": wv})
