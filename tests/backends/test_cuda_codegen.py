"""The CUDA backend without a GPU: the generated C compiles with nvcc, launch arithmetic,
the errors a user sees (no GPU, a kernel that does not compile), `ember opt --emit cuda`."""

from __future__ import annotations

import functools
import io
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.backends import cuda
from ember.backends.cuda import launch as L
from ember.backends.cuda.codegen import lower
from ember.backends.cuda.program import Gemm, Launch
from ember.backends.cuda.templates import reduce_shape, transpose_dims
from ember.frontend.trace import TensorSpec, trace_function
from ember.ir import Builder, Graph, TensorType
from ember.ir.parser import parse
from ember.passes.manager import PassManager, parse_pipeline
from ember.runtime.backend import BackendUnavailableError, get_backend
from ember.runtime.models import Cnn, Mlp
from ember.runtime.pipeline import Stages, training_pipeline

pytestmark = pytest.mark.slow  # nvcc compiles


def _nvrtc_reason() -> str | None:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as e:  # noqa: BLE001  (no cupy, or no libnvrtc)
        return f"NVRTC is not loadable here ({type(e).__name__}: {str(e)[:120]}); " \
               "pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12 to run it without a GPU"
    return None


NVRTC_REASON = _nvrtc_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_REASON is not None, reason=NVRTC_REASON or "")
NVCC = shutil.which("nvcc")
PTXAS = shutil.which("ptxas")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


class Block(nn.Module):
    """An attention-like block: layer norm, causal multi-head attention, dropout, GELU MLP."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = nn.MultiHeadAttention(d, heads, causal=True)
        self.drop = nn.Dropout(0.1)
        self.ff = nn.Linear(d, d)
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        x = x + self.drop(self.attn(self.norm(x)))
        x = x + nn.functional.gelu(self.ff(x))
        return self.head(x.mean(axis=1))


MODELS = {"mlp": (Mlp, (32, 64), optim.Adam(lr=1e-3)),
          "cnn": (Cnn, (8, 1, 8, 8), optim.SGD(lr=0.1, momentum=0.9)),
          "attention": (Block, (4, 6, 16), optim.AdamW(lr=1e-3))}


@functools.cache
def train_step(name: str, fused: bool) -> Graph:
    """The whole training step (forward, backward, optimizer) of a model, as the runtime
    compiles it, optionally after the `fuse` pass."""
    em.seed(0)
    make, shape, opt = MODELS[name]
    model = make()
    specs = (TensorSpec(shape, "f32"), TensorSpec((shape[0],), "i64"))
    g = trace_function(lambda x, y: nn.functional.cross_entropy(model(x), y), model, specs,
                       name=f"{name}_step", training=True)
    passes = [p for p in training_pipeline(opt.pass_spec()) if p != "fuse"]
    return Stages(g, passes + (["fuse"] if fused else [])).graph


def nvcc_ptx(source: str, tmp_path, name="k") -> tuple[str, str]:
    cu, ptx = tmp_path / f"{name}.cu", tmp_path / f"{name}.ptx"
    cu.write_text(source)
    r = subprocess.run([NVCC, "-ptx", "-arch=sm_90", str(cu), "-o", str(ptx)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr, str(ptx)


# -- the generated C compiles -----------------------------------------------------------------

@needs_nvcc
@pytest.mark.parametrize("fused", [False, True], ids=["per-op", "fused"])
@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_compiles_with_nvcc(name, fused, tmp_path):
    """Every kernel of the step, as ONE translation unit: nvcc -ptx -arch=sm_90 accepts it
    with no warning, and (when ptxas is here) no kernel spills registers."""
    program = lower(train_step(name, fused))
    assert program.kernels and len({k.name for k in program.kernels}) == len(program.kernels)
    stderr, ptx = nvcc_ptx(program.source, tmp_path, name)
    assert "warning" not in stderr, stderr[-3000:]
    entries = re.findall(r"\.visible \.entry (\w+)\(", open(ptx).read())
    assert sorted(entries) == sorted(k.name for k in program.kernels)
    if PTXAS:
        r = subprocess.run([PTXAS, "-arch=sm_90", "-v", ptx, "-o", str(tmp_path / "k.cubin")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
        assert spills and not any(int(s) for s in spills), r.stderr[-2000:]


def _combined(fused):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    try:
        import test_cuda_ops
    finally:
        sys.path.pop(0)
    return test_cuda_ops.combined(fused)[0]


@needs_nvcc
@pytest.mark.parametrize("fused", [False, True], ids=["per-op", "fused"])
def test_op_cases_compile_with_nvcc(fused, tmp_path):
    stderr, _ = nvcc_ptx(cuda.emit_cuda(_combined(fused)), tmp_path)
    assert "warning" not in stderr, stderr[-3000:]


@needs_nvrtc
@pytest.mark.parametrize("name,fused", [(n, f) for n in MODELS for f in (False, True)] +
                         [("cases", False), ("cases", True)])
def test_nvrtc_compiles_it_without_a_gpu(name, fused):
    """NVRTC itself (what cupy compiles with on a GPU), driver-less, with cupy's options."""
    graph = _combined(fused) if name == "cases" else train_step(name, fused)
    ptx = cuda.compile_ptx(graph)
    assert ptx.count(".entry") == len(lower(graph).kernels)


@needs_nvrtc
def test_nvrtc_compile_error_names_the_line_and_op(monkeypatch):
    from ember.backends.cuda import codegen

    orig = codegen.expr
    monkeypatch.setattr(codegen, "expr", lambda n, a, v, d: f"undefined_fn({v[0]})"
                        if n == "ember.log" else orig(n, a, v, d))
    with pytest.raises(cuda.CudaCompileError) as e:
        cuda.compile_ptx(train_step("mlp", False))
    msg = str(e.value)
    assert re.match(r"CUDA compile of @mlp_step failed \(4 errors\):\n  line \d+: ", msg), msg
    assert msg.count("in kernel") == 1  # four lanes of one float4 kernel
    assert 'identifier "undefined_fn" is undefined' in msg and "= undefined_fn(" in msg
    assert re.search(r'in kernel k\d+_log, generated for op: %\d+ = "ember.log"', msg), msg


def test_emit_cuda_is_one_translation_unit_with_a_line_map():
    program = lower(train_step("mlp", False))
    src = program.source.splitlines()
    kernels = [line for line in src if line.startswith('extern "C" __global__')]
    assert len(kernels) == len(program.kernels)
    for k in program.kernels:
        assert src[k.first_line - 1].startswith("// %")  # the IR op it implements
        assert f" {k.name}(" in src[k.first_line]
        assert src[k.last_line - 1] == "}"
        assert program.locate(k.first_line + 2) == k
    assert cuda.emit_cuda(train_step("mlp", False)) == program.source


def test_plan_folds_transposes_into_gemms_and_fuses_epilogues():
    program = lower(train_step("mlp", False))
    gemms = [s for s in program.steps if isinstance(s, Gemm)]
    assert len(gemms) == 5  # 2 forward, 3 backward: every x^T / W^T is a strided view
    assert sum("transpose" in k.name for k in program.kernels) == 0
    assert any(g.a.strides[-2:] == (1, 64) for g in gemms)  # x^T [64, 32] read in place
    bias = next(s for s in program.steps if isinstance(s, Launch) and s.kernel.endswith("_add"))
    assert bias.args[0] == gemms[0].out.slot  # bias added in place: an epilogue


@pytest.mark.parametrize("fused", [False, True], ids=["per-op", "fused"])
def test_a_linear_on_batched_rows_is_one_2d_gemm(fused):
    """[B, T, C] @ W: the batch dims continue A's and C's rows, so cuBLAS gets one
    [B*T, C] x [C, N] GEMM, not a batch against a broadcast weight."""
    g = Graph("f", [TensorType((4, 6, 8), "f32"), TensorType((8, 5), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.tanh", b.op("ember.matmul", *g.args))])
    if fused:
        g = PassManager(parse_pipeline("fuse")).run(g)
    (gemm,) = [s for s in lower(g).steps if isinstance(s, Gemm)]
    assert (gemm.a.shape, gemm.b.shape, gemm.out.shape) == ((24, 8), (8, 5), (24, 5))


def test_windows_are_one_kernel_each():
    """slice: one strided read; unslice: a memset only where the window leaves zeros;
    concat: one kernel for all its operands; and an offset window index that passes int32
    range is a long long."""
    big = TensorType((3, 2**30), "i1")
    g = Graph("f", [TensorType((6, 8), "f32"), TensorType((3, 4), "f32"), big])
    b = Builder(g.body)
    x, y, z = g.args
    outs = [b.op("ember.slice", x, start=[1, 2], step=[2, 1], shape=[3, 4]),
            b.op("ember.unslice", y, start=[1, 2], step=[2, 1], shape=[6, 8]),
            b.op("ember.unslice", y, start=[0, 0], step=[1, 1], shape=[3, 4]),
            b.op("ember.concat", x, x, x, axis=1),
            b.op("ember.slice", z, start=[2, 5], step=[1, 1], shape=[1, 3])]
    b.create("func.return", outs)
    p = lower(g)
    assert [type(s).__name__ for s in p.steps] == ["Launch", "Memset"] + ["Launch"] * 4
    assert [s.kernel for s in p.steps if isinstance(s, Launch)] == [
        "k0_slice", "k1_unslice", "k2_unslice", "k3_concat", "k4_slice"]
    assert "in0[o0 + 10]" in p.source and "out0[w0 + 10]" in p.source
    assert "long long n = 3;" in p.source and f"in0[o0 + {2 * 2**30 + 5}]" in p.source


@pytest.mark.parametrize("fused", [False, True], ids=["per-op", "fused"])
@pytest.mark.parametrize("name", list(MODELS))
def test_arena_never_overlaps_live_buffers(name, fused):
    """Results and scratch share one arena: two slots that some step both touches, or that
    are alive across a common step, never share a byte; and the sharing saves memory."""
    from ember.backends.cuda.program import step_slots

    p = lower(train_step(name, fused))
    live = {}
    for k, step in enumerate(p.steps):
        for i in step_slots(step):
            if p.slots[i].offset is not None:
                live.setdefault(i, [k, k])[1] = k
    returned = {i for i, _ in p.outputs}
    assert all(p.slots[i].offset is None for i in returned if p.slots[i].kind == "temp")
    spans = {i: (p.slots[i].offset, p.slots[i].offset + p.slots[i].type.nbytes) for i in live}
    for i in live:
        assert spans[i][0] % L.ALIGN == 0 and spans[i][1] <= p.arena_bytes
        for j in live:
            if i < j and live[i][0] <= live[j][1] and live[j][0] <= live[i][1]:
                assert spans[i][1] <= spans[j][0] or spans[j][1] <= spans[i][0], (i, j)
    total = sum(L.round_up(p.slots[i].type.nbytes) for i in live)
    assert p.arena_bytes < total
    report = p.memory_report()
    assert report["arena_bytes"] == p.arena_bytes and report["params"] > 0


# -- launch arithmetic -------------------------------------------------------------------------

def test_elementwise_launch():
    assert L.elementwise(1).grid == (1, 1, 1) and L.elementwise(0).grid == (1, 1, 1)
    assert L.elementwise(256 * 10).grid == (10, 1, 1)
    big = L.elementwise(10**9, sm_count=132)
    assert big.grid[0] == 132 * 8 * L.WAVES and big.block == (256, 1, 1) and big.shared == 0
    assert L.index_type(2**30) == "int" and L.index_type(5, 2**31 - 1) == "long long"


def test_vector_width_and_alignment():
    assert L.vector_width(1024, ["f32"] * 3, ["full", "scalar"]) == 4
    assert L.vector_width(3, ["f32"], ["full"]) == 1  # fewer than a vector
    assert L.vector_width(1024, ["f32", "f64"], ["full"]) == 1
    assert L.vector_width(1024, ["f32"] * 2, ["strided"]) == 1
    assert L.aligned(0x1000) and not L.aligned(0x1004) and L.aligned(0x1004, 4)
    assert L.round_up(1) == 256 and L.round_up(512) == 512


def test_vectorized_kernel_has_a_scalar_tail():
    g = Graph("f", [TensorType((1030,), "f32"), TensorType((), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.mul", *g.args)])
    src = cuda.emit_cuda(g)
    assert "reinterpret_cast<const float4*>(in0)[v]" in src and "nv * 4 +" in src


def test_reduce_plans():
    row = L.reduce_plan(32, 10, True, 4)
    assert row.strategy == "row" and row.launch.block == (32, 1, 1) and row.splits == 1
    assert row.launch.shared == 4 and row.launch.grid == (32, 1, 1)
    wide = L.reduce_plan(1, 10**6, True, 8, sm_count=132)
    assert wide.launch.block == (512, 1, 1) and wide.launch.shared == 16 * 8
    assert wide.splits > 1 and wide.splits * wide.chunk >= 10**6
    assert (wide.splits - 1) * wide.chunk < 10**6 and wide.finalize is not None
    assert wide.partial_elems == wide.splits
    col = L.reduce_plan(128, 32, False, 4)
    assert col.strategy == "column" and col.splits == 1 and col.launch.shared == 0
    tall = L.reduce_plan(10, 10**5, False, 4, sm_count=4)
    assert tall.splits > 1 and tall.partial_elems == 10 * tall.splits
    assert L.reduce_plan(10, 10**5, False, 4, allow_split=False).splits == 1


def test_reduce_and_transpose_geometry():
    rs = reduce_shape((2, 3, 4, 5), [1, 3])
    assert rs.kept == ((2, 60), (4, 5)) and rs.reduced == ((3, 20), (5, 1))
    assert rs.inner_reduced and rs.outputs == 8 and rs.size == 15
    assert not reduce_shape((32, 128), [0]).inner_reduced
    assert reduce_shape((6, 1, 5), [0, 1]).reduced == ((6, 5),)
    assert transpose_dims((2, 3, 4), [0, 2, 1]) == [(2, (12, 12)), (4, (3, 1)), (3, (1, 4))]


def test_transpose_launch():
    t = L.transpose(70, 33, 1, 4)
    assert t.grid == (3, 2, 1) and t.block == (32, 8, 1) and t.shared == 32 * 33 * 4
    assert L.transpose(10, 10**7, 10**6, 1).grid[1:] == (65535, 65535)


# -- errors ----------------------------------------------------------------------------------

def test_backend_cuda_without_a_gpu_is_one_clear_error():
    try:
        cuda.check_available()
    except cuda.CudaUnavailableError as e:
        reason = str(e)
    else:
        pytest.skip("this machine has a usable GPU")
    assert "cupy" in reason and ("driver" in reason or "not installed" in reason
                                 or "NVRTC" in reason or "cuBLAS" in reason)
    with pytest.raises(BackendUnavailableError, match="backend 'cuda'") as e:
        get_backend("cuda")
    assert str(e.value) == reason
    with pytest.raises(BackendUnavailableError, match="backend 'cuda'"):
        em.compile(Mlp(), TensorSpec((4, 64), "f32"), backend="cuda")
    with pytest.raises(cuda.CudaUnavailableError, match="backend 'cuda'"):
        cuda.compile(train_step("mlp", False))


def test_missing_cupy_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(cuda.CudaUnavailableError, match=r"needs cupy, which is not installed.*"
                                                          r"pip install 'ember\[gpu\]'"):
        cuda.check_available()


def test_missing_driver_is_named(monkeypatch):
    pytest.importorskip("cupy")
    import cupy

    class NoDriver(RuntimeError):
        pass

    def fail():
        raise NoDriver("cudaErrorInsufficientDriver: CUDA driver version is insufficient")

    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceCount", fail)
    with pytest.raises(cuda.CudaUnavailableError, match="no usable GPU.*"
                       "cudaErrorInsufficientDriver.*no NVIDIA driver"):
        cuda.check_available("cuda:0")


def test_device_strings():
    assert cuda.parse_device("cuda") == 0 and cuda.parse_device("cuda:3") == 3
    assert cuda.parse_device(2) == 2 and cuda.parse_device(None) == 0
    for bad in ("cpu", "cuda:", "cuda:x", "gpu:0", -1):
        with pytest.raises(ValueError, match="use \"cuda\" or \"cuda:N\""):
            cuda.parse_device(bad)


@needs_nvcc
def test_compile_error_shows_the_source_line_and_the_ir_op(monkeypatch, tmp_path):
    """A kernel NVRTC rejects: the message has the failing line and the op it came from."""
    from ember.backends.cuda import codegen

    orig = codegen.expr
    monkeypatch.setattr(codegen, "expr", lambda n, a, v, d: "undefined_fn(a0)"
                        if n == "ember.exp" else orig(n, a, v, d))
    program = lower(train_step("mlp", False))
    cu = tmp_path / "k.cu"
    cu.write_text(program.source)
    r = subprocess.run([NVCC, "-ptx", "-arch=sm_90", str(cu), "-o", str(tmp_path / "k.ptx")],
                       capture_output=True, text=True)
    assert r.returncode != 0
    msg = program.explain(r.stderr)
    assert 'identifier "undefined_fn" is undefined' in msg
    assert "undefined_fn(a0)" in msg  # the generated line
    assert re.search(r'in kernel k\d+_exp, generated for op: %\d+ = "ember.exp"', msg), msg


def test_unsupported_op_names_the_fix():
    g = Graph("f", [TensorType((4, 3), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("nn.softmax", g.args[0], axis=1)])
    with pytest.raises(cuda.UnsupportedOpError, match="'nn.softmax'.*decompose"):
        cuda.emit_cuda(g)
    g = Graph("f", [TensorType((4, 3), "f16")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.exp", g.args[0])])
    with pytest.raises(cuda.UnsupportedOpError, match="f16"):
        cuda.emit_cuda(g)


# -- ember opt --emit cuda -------------------------------------------------------------------------

def test_ember_opt_emits_cuda(tmp_path):
    from ember.__main__ import main

    path = tmp_path / "step.mlir"
    path.write_text(str(train_step("mlp", False)))
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["opt", str(path), "--emit", "cuda"]) == 0
    assert out.getvalue() == cuda.emit_cuda(parse(path.read_text()))
    with redirect_stdout(io.StringIO()) as out:
        assert main(["opt", str(path), "-p", "fuse", "--emit", "cuda"]) == 0
    assert "kernel.fused" in out.getvalue() and 'extern "C"' in out.getvalue()


def test_ember_opt_emit_cuda_error(tmp_path):
    from ember.__main__ import main

    g = Graph("f", [TensorType((4, 3), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("nn.softmax", g.args[0], axis=1)])
    path = tmp_path / "g.mlir"
    path.write_text(str(g))
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        assert main(["opt", str(path), "--emit", "cuda"]) == 1
    assert "no kernel for 'nn.softmax'" in err.getvalue()
    with redirect_stdout(io.StringIO()) as out:
        assert main(["opt", str(path), "-p", "decompose", "--emit", "cuda"]) == 0
    assert "reduce_max" in out.getvalue()


def test_constants_are_uploaded_once_not_inlined():
    g = Graph("f", [TensorType((2, 3), "f32")])
    b = Builder(g.body)
    c = b.op("ember.constant", value=np.arange(6, dtype=np.float32).reshape(2, 3))
    b.create("func.return", [b.op("ember.add", g.args[0], c)])
    program = lower(g)
    (const,) = [s for s in program.slots if s.kind == "const"]
    np.testing.assert_array_equal(const.value, np.arange(6).reshape(2, 3))
