"""Repeated layers share their kernels: the cpu backend emits one function per distinct
kernel (op, attributes, types, fused body) and calls it for every step that runs it."""

import re

import numpy as np

import ember as em
from ember import nn, optim
from ember.backends import cpu
from ember.backends.cpu import codegen


class Deep(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.inp = nn.Linear(12, 16)
        self.layers = [nn.Linear(16, 16) for _ in range(layers)]
        self.norm, self.out = nn.LayerNorm(16), nn.Linear(16, 5)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = x + nn.functional.gelu(layer(x))
        return self.out(self.norm(x))


def kernels(step) -> tuple[int, int]:
    """(steps the executable runs, kernel functions it defines: `k12_matmul`, not its
    helpers `k12_matmul.gemm`, `k12_matmul.epilogue.rows`)."""
    exe = step._last.run
    return len(exe.plan.steps), len(re.findall(r'^define internal void @"?k\d+_\w+"?\(',
                                              exe.llvm_ir, re.M))


def test_deeper_models_add_calls_not_kernels():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 5, 8)
    counts, losses = {}, {}
    for layers in (2, 6):
        for backend in ("cpu", "interpreter"):
            em.seed(0)
            step = em.compile_train_step(Deep(layers), nn.functional.cross_entropy,
                                         optim.SGD(lr=0.1), backend=backend)
            losses[layers, backend] = [step(x, y) for _ in range(3)]
            if backend == "cpu":
                counts[layers] = kernels(step)
        np.testing.assert_allclose(losses[layers, "cpu"], losses[layers, "interpreter"],
                                   rtol=1e-5)
    (steps2, fns2), (steps6, fns6) = counts[2], counts[6]
    assert steps6 > steps2 + 8  # four more layers: more steps ...
    assert fns6 <= fns2 + 2 < steps6  # ... but (nearly) no more kernel functions


def test_a_deep_models_entry_calls_its_kernels_in_segments():
    """Each function of the entry calls at most `codegen.SEGMENT` kernels, so no function
    grows with depth (one entry calling every kernel, every buffer pointer live across
    all of them, made LLVM's codegen superlinear: 500 layers took 4.9 s of codegen)."""
    em.seed(0)
    step = em.compile_train_step(Deep(40), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend="cpu")
    x = np.zeros((8, 12), np.float32)
    step(x, np.zeros(8, np.int64))
    exe = step._last.run
    parts = re.findall(r'^define internal void @"?ember_entry\.part\d+"?\(.*?^}', exe.llvm_ir,
                       re.M | re.S)
    calls = [len(re.findall(r'call void @"?k\d+_', part)) for part in parts]
    steps = len(exe.plan.steps)
    # a cut every SEGMENT steps, and one after the loss's step (codegen.loss_check)
    cut = exe.plan.loss_check[0] + 1
    assert steps > 2 * codegen.SEGMENT and 0 < cut % codegen.SEGMENT
    assert len(parts) == -(-steps // codegen.SEGMENT) + 1
    assert max(calls) == codegen.SEGMENT and sum(calls) == steps


def test_gather_and_scatter_keep_a_function_each():
    """Their out-of-range status code is the step's own, so they are never shared."""
    g = em.ir.Graph("f", [em.ir.TensorType((7, 3), "f32"), em.ir.TensorType((4,), "i64")])
    b = em.ir.Builder(g.body)
    rows = [b.op("ember.gather", g.args[0], g.args[1]) for _ in range(2)]
    b.create("func.return", [b.op("ember.add", *rows)])
    exe = cpu.Executable(g, use_cache=False)
    gathers = re.findall(r"^define internal void @\"?(k\d+_gather)", exe.llvm_ir, re.M)
    assert len(gathers) == 2
