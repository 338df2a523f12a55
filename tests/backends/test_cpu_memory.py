"""The cpu backend runs the memory plan: its temporaries share one arena at the planner's
offsets, so what a training step really allocates follows the planned peak under every
recompute strategy, and recomputing really saves memory; an arena that cannot be
allocated fails at compile time."""

from __future__ import annotations

import numpy as np
import pytest
from small_models import Block

import ember as em
from ember import nn, optim
from ember.ir import Builder, Graph, TensorType

F = nn.functional
STRATEGIES = ("none", "balanced", "min-cut", "all")


class Mlp(nn.Module):
    def __init__(self, d: int = 64, depth: int = 8):
        super().__init__()
        self.layers = [nn.Linear(d, d) for _ in range(depth)]
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.pool, self.head = nn.MaxPool2d(2), nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x)))))))
        return self.head(x.reshape((x.shape[0], -1)))


def batch(shape):
    rng = np.random.default_rng(0)
    return rng.normal(size=shape).astype(np.float32), rng.integers(0, 10, shape[0])


MODELS = {"mlp": (Mlp, (512, 64)), "cnn": (Cnn, (16, 3, 16, 16)),
          "block": (Block, (16, 16, 32))}


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_real_bytes_follow_the_plan_under_every_strategy(name, capsys):
    cls, shape = MODELS[name]
    x, y = batch(shape)
    rows = {}
    for s in STRATEGIES:
        em.seed(0)
        step = em.compile_train_step(cls(), F.cross_entropy, optim.SGD(lr=0.1),
                                     backend="cpu", recompute=s)
        step(x, y)
        rows[s] = r = step.memory_report()
        # the plan models what the cpu does (views, in-place fused kernels, returned
        # results held through the call, each kernel's scratch as the backend sizes it)
        assert 0.9 * r["peak_bytes"] <= r["real_bytes"] <= 1.1 * r["peak_bytes"], (s, r)
    real = {s: r["real_bytes"] for s, r in rows.items()}
    assert real["balanced"] <= real["none"] and real["all"] <= real["none"]
    with capsys.disabled():
        print(f"\n{name}: planned / real bytes: " + ", ".join(
            f"{s} {r['peak_bytes']:,} / {r['real_bytes']:,}" for s, r in rows.items()))


def _huge_temporary() -> Graph:
    """x -> broadcast to 2**60 elements -> sum: a temporary no machine can hold."""
    g = Graph("huge", [TensorType((1,), "f32")], ["x"])
    b = Builder(g.body)
    big = b.op("ember.broadcast", g.args[0], shape=[2**60])
    b.create("func.return", [b.op("ember.reduce_sum", big, axes=[0], keepdims=False)])
    return g


def test_an_arena_that_does_not_fit_fails_at_compile_time():
    from ember.backends import cpu

    with pytest.raises(MemoryError, match=r"@huge: the memory plan needs an arena of "
                                          r"4,611,686,018,427,387,904 bytes"):
        cpu.compile(_huge_temporary())


def test_arena_is_what_the_executable_holds_and_guard_mode_keeps_one_buffer_each():
    from ember.backends import cpu
    from ember.backends.cpu.call.buffers import guarded

    g = Graph("chain", [TensorType((256,), "f32")], ["x"])
    b = Builder(g.body)
    v = g.args[0]
    for name in ("ember.exp", "ember.neg", "ember.exp"):  # each dies into the next
        v = b.op(name, v)
    b.create("func.return", [b.op("ember.reduce_sum", v, axes=[0], keepdims=False)])
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    want = np.exp(-np.exp(x)).sum()
    exe = cpu.compile(g)
    assert exe.memory()["arena"] == 1024  # one buffer, written in place twice
    np.testing.assert_allclose(exe([x])[0], want, rtol=1e-6)
    with guarded():
        exe = cpu.compile(g)
        assert exe.memory()["arena"] == 3 * 1024
        np.testing.assert_allclose(exe([x])[0], want, rtol=1e-6)


def test_a_kernel_reading_its_donor_through_another_map_too_does_not_write_over_it():
    """x * x^T as one kernel over one buffer: writing the product into x's buffer would
    clobber elements the transposed read still needs."""
    from ember.backends import cpu, interpreter
    from ember.ir import verify
    from ember.ir.parser import parse

    g = verify(parse("""
    func.func @f(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
      %t = "ember.tanh"(%x) : (tensor<8x8xf32>) -> tensor<8x8xf32>
      %p = "kernel.fused"(%t, %t) ({
      ^bb0(%a: f32, %b: f32):
        %m = "kernel.mul"(%a, %b) : (f32, f32) -> f32
        "kernel.yield"(%m) : (f32) -> ()
      }) {maps = [[8, 1], [1, 8]], out_maps = [[8, 1]], out_types = [tensor<8x8xf32>],
          space = [8, 8]} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %r = "ember.neg"(%p) : (tensor<8x8xf32>) -> tensor<8x8xf32>
      func.return %r : tensor<8x8xf32>
    }"""))
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    np.testing.assert_allclose(cpu.Executable(g, use_cache=False)([x])[0],
                               interpreter.run(g, [x])[0], rtol=1e-6)


def test_the_plan_counts_each_kernels_scratch_as_the_executable_places_it():
    """The cpu's packed GEMM panels are in the plan (memory_report's `scratch`, at the
    peak), and the classes still add up to the peak."""
    from ember.ir.memory_plan import CLASSES
    from ember.passes.memory import plan_memory

    x, y = batch((512, 64))
    em.seed(0)
    step = em.compile_train_step(Mlp(), F.cross_entropy, optim.SGD(lr=0.1), backend="cpu")
    step(x, y)
    r = step.memory_report()
    assert r["scratch"] > 0 and r["peak_bytes"] == sum(r[c] for c in CLASSES)
    assert r["peak_bytes"] > plan_memory(step.graph).peak_bytes  # the graph's plan alone
