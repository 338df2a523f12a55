"""GEMM weights packed once (backends/cpu/codegen.py `_packed_slot`, call/executable.py): an
inference graph (`ember.constant_params`) has each GEMM that would pack a param on every
call read panels packed when the param's array was bound. Outputs stay those of the
unpacked code and of the interpreter; a param is packed once over many calls, and again
when it gets a new value (a new array, `set_value`, a training step's update in place)."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from ember import nn
from ember.backends import cpu
from ember.backends.cpu.call.buffers import guarded
from ember.backends.cpu.codegen import CONSTANT_PARAMS
from ember.backends.cpu.gemm.matmul import plan_matmul
from ember.backends.cpu.machine.host import host_isa
from ember.ir import Builder, Graph, TensorType, verify
from ember.ir.parser import parse
from ember.ir.printer import print_graph
from ember.passes import PassManager, parse_pipeline

F = nn.functional


class Mlp(nn.Module):
    """Two Linears whose weights the GEMMs pack (K x N over PACK_B_BYTES), the second
    read transposed (x @ w.T) and N not a multiple of the panels' width."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 300)
        self.out = em.Param((520, 300), em.init.Normal(0, 0.05))

    def forward(self, x):
        return F.gelu(self.fc(x)) @ self.out.T


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 24, 256)).astype(np.float32)


def _exe(forward) -> cpu.Executable:
    return forward._require().run


def _reference(model, x) -> np.ndarray:
    return em.compile(model, x, backend="interpreter")(x)


def test_outputs_are_the_unpacked_codes_and_the_interpreters():
    em.seed(0)
    model, x = Mlp(), _x()
    forward = em.compile(model, x)
    exe = _exe(forward)
    assert len(exe.plan.packs) == 2 and exe.memory()["packed"] > 0
    unmarked = parse(print_graph(forward.graph))  # the same graph: nothing packed
    del unmarked.attributes[CONSTANT_PARAMS]
    plain = cpu.Executable(unmarked, use_cache=False)
    assert not plain.plan.packs
    params = {pid: p.val() for pid, p in forward.param_table().items()}
    got = forward(x)
    np.testing.assert_allclose(got, plain([x], params)[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-5, atol=1e-5)


def test_a_param_is_packed_once_over_calls_and_again_when_set():
    em.seed(1)
    model, x = Mlp(), _x()
    forward = em.compile(model, x)
    exe = _exe(forward)
    packs = len(exe.plan.packs)
    for _ in range(3):
        forward(x)
    assert exe.packings == packs
    w = model.fc.weight
    w.set_value(np.random.default_rng(2).standard_normal(w.shape).astype(np.float32))
    got = forward(x)
    assert exe.packings == 2 * packs
    np.testing.assert_allclose(got, _reference(model, x), rtol=1e-5, atol=1e-5)
    forward(_x(3))
    assert exe.packings == 2 * packs


def test_a_training_steps_update_in_place_is_packed_again():
    """After its first, a step updates some Params' arrays in place (call/bound.py
    `donate`): the same arrays with new values, which the next inference call packs again."""
    em.seed(4)
    model, x = Mlp(), _x()
    forward = em.compile(model, x)
    reference = em.compile(model, x, backend="interpreter")
    step = em.compile_train_step(model, lambda y, t: F.mse_loss(y, t), em.optim.SGD(lr=0.5))
    target = np.zeros((2, 24, 520), np.float32)
    arrays = []
    for _ in range(3):
        step(x, target)
        arrays.append(model.fc.weight.val())
        np.testing.assert_allclose(forward(x), reference(x), rtol=1e-5, atol=1e-5)
    assert arrays[1] is arrays[2]  # updated in place
    assert not _exe(step).plan.packs  # a training step packs as it multiplies


def _linear_graph(n: int, k: int, transposed: bool, batch: tuple = ()) -> Graph:
    """y = x @ w (w [k, n], or [n, k] read transposed) for x [*batch, 32, k], w a param
    [*batch, ...], marked."""
    g = Graph("f", [TensorType((*batch, 32, k), "f32")])
    b = Builder(g.body)
    shape = (*batch, n, k) if transposed else (*batch, k, n)
    w = b.create("ember.param", [], {"id": "w", "path": "w"},
                 result_types=[TensorType(shape, "f32")]).result
    if transposed:
        w = b.op("ember.transpose", w, perm=[1, 0])
    b.create("func.return", [b.op("ember.matmul", g.args[0], w)])
    g.attributes[CONSTANT_PARAMS] = True
    return PassManager(parse_pipeline("fuse")).run(verify(g))  # the transpose into the GEMM


@pytest.mark.parametrize("transposed", [False, True], ids=["w", "w.T"])
def test_executable_packs_a_new_array_or_after_params_changed(transposed):
    """Each call packs what is not packed yet: another array bound for the param, or all
    after `params_changed()`; inside `guarded()` a read past the panels (N = 300 pads the
    last) would fault."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 512)).astype(np.float32)
    shape = (300, 512) if transposed else (512, 300)
    with guarded():
        exe = cpu.Executable(_linear_graph(300, 512, transposed), use_cache=False)
        assert len(exe.plan.packs) == 1
        w = rng.standard_normal(shape).astype(np.float32)

        def want(w):
            return x @ (w.T if transposed else w)

        np.testing.assert_allclose(exe([x], {"w": w})[0], want(w), rtol=1e-4, atol=1e-4)
        exe([x], {"w": w})
        assert exe.packings == 1
        w2 = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(exe([x], {"w": w2})[0], want(w2), rtol=1e-4, atol=1e-4)
        assert exe.packings == 2
        w2 *= -1  # in place: the caller says so
        exe.params_changed()
        np.testing.assert_allclose(exe([x], {"w": w2})[0], want(w2), rtol=1e-4, atol=1e-4)
        assert exe.packings == 3


def test_a_packed_executables_feedback_runs_the_general_call():
    """A bound call (call/bound.py) binds params without looking for a new array to pack:
    feeding y back as x, which would carry, runs `run_values` every time instead."""
    exe = cpu.Executable(_linear_graph(512, 512, False), use_cache=False)
    x, w = np.ones((32, 512), np.float32), np.full((512, 512), 1 / 512, np.float32)
    run = exe.feedback({0: 0})
    assert exe.plan.packs and not run.carries
    for _ in range(2):
        x = run([x], [w])[0]
    w = w * 2
    np.testing.assert_allclose(run([x], [w])[0], np.full((32, 512), 2, np.float32), rtol=1e-5)


def test_only_gemms_that_would_pack_read_packed(monkeypatch):
    """A B the own GEMM reads in place (small), a batched GEMM and the graphs of training
    steps pack nothing ahead; a packed GEMM never calls OpenBLAS, which packs per call,
    and holds less scratch than the own GEMM packing per call (which the measured cost
    table may not choose here: it is asked for)."""
    isa = host_isa()
    small = cpu.Executable(_linear_graph(16, 16, False), use_cache=False)
    batched = cpu.Executable(_linear_graph(300, 512, False, (2,)), use_cache=False)
    assert not small.plan.packs and not batched.plan.packs
    big = cpu.Executable(_linear_graph(300, 512, False), use_cache=False)
    (pk,) = big.plan.packs
    op = big.plan.steps[pk.step].op
    assert plan_matmul(op, isa, 2, prepack=True).engine == "own"
    monkeypatch.setenv("EMBER_GEMM", "own")
    assert plan_matmul(op, isa, 2, prepack=True).scratch < plan_matmul(op, isa, 2).scratch
