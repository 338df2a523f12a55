"""The cpu backend under the runtime: one native call per training step, fused training
matching the interpreter, the compile cache across processes, and bad inputs."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ember as em
import ember.runtime.steps as steps
from ember import nn, optim
from ember.backends import cpu
from ember.ir import Builder, Graph, TensorType, verify


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 20), nn.Linear(20, 5)

    def forward(self, x):
        return self.fc2(nn.functional.relu(self.fc1(x)))


@pytest.fixture
def fused_pipeline(monkeypatch):
    """Training steps compiled with `fuse` at the end of the pipeline."""
    plain = steps.training_pipeline
    monkeypatch.setattr(steps, "training_pipeline", lambda *a, **k: plain(*a, **k) + ["fuse"])


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((16, 12)).astype(np.float32), rng.integers(0, 5, 16)


def test_training_step_is_one_native_call(fused_pipeline):
    em.seed(0)
    step = em.compile_train_step(Mlp(), nn.functional.cross_entropy,
                                 optim.SGD(lr=0.1, momentum=0.9), backend="cpu")
    x, y = batch()
    step(x, y)
    exe = step._last.run
    assert isinstance(exe, cpu.Executable) and len(exe.plan.steps) > 3  # many kernels...
    calls = []
    inner = exe._entry
    exe._entry = lambda table: calls.append(1) or inner(table)  # ...one call into them
    for _ in range(5):
        step(x, y)
    assert len(calls) == 5 and exe.native_calls == 6


def test_fused_training_matches_the_interpreter(fused_pipeline):
    results = {}
    for backend in ("interpreter", "cpu"):
        em.seed(1)
        model = Mlp()
        step = em.compile_train_step(model, nn.functional.cross_entropy,
                                     optim.Adam(lr=1e-2), backend=backend)
        losses = [step(*batch(s)) for s in range(4)]
        assert any(op.name == "kernel.matmul" for op in step._last.graph.ops)
        results[backend] = losses, {k: v.copy() for k, v in model.state_dict().items()}
    np.testing.assert_allclose(results["cpu"][0], results["interpreter"][0], rtol=1e-5)
    for k, v in results["interpreter"][1].items():
        np.testing.assert_allclose(results["cpu"][1][k], v, rtol=1e-4, atol=1e-6, err_msg=k)


def test_compile_cache_second_process_loads_object_code(tmp_path):
    script = textwrap.dedent("""
        import json, sys, time
        import numpy as np
        import ember as em
        import ember.runtime.steps as steps
        from ember import nn, optim
        plain = steps.training_pipeline
        steps.training_pipeline = lambda *a, **k: plain(*a, **k) + ["fuse"]
        em.seed(0)
        model = nn.Linear(12, 5)
        step = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                     backend="cpu")
        x = np.ones((8, 12), np.float32); y = np.zeros(8, np.int64)
        loss = step(x, y)
        exe = step._last.run
        print(json.dumps({"cached": exe.cached, "loss": loss,
                          "backend_s": exe.timings["total"]}))
    """)
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path), "EMBER_CACHE": "1"}
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                      capture_output=True, text=True).stdout.splitlines()[-1])
            for _ in range(2)]
    assert [r["cached"] for r in runs] == [False, True]
    assert runs[0]["loss"] == runs[1]["loss"]
    assert list((tmp_path / "cpu").glob("*.o"))


def _graph():
    g = Graph("f", [TensorType((4, 3), "f32"), TensorType((4,), "i64")], ["x", "labels"])
    b = Builder(g.body)
    x, lab = g.args
    hot = b.op("ember.one_hot", lab, num_classes=3, dtype="f32")
    b.create("func.return", [b.op("ember.add", x, hot)])
    return verify(g)


def test_inputs_are_converted_or_rejected_by_name():
    exe = cpu.Executable(_graph(), use_cache=False)
    x = np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2]  # strided, float64
    labels = np.array([0, 2, 1, 1], np.int32)  # i32 labels widen to i64
    want = x.astype(np.float32) + np.eye(3, dtype=np.float32)[labels]
    np.testing.assert_array_equal(exe([x, labels])[0], want)
    np.testing.assert_array_equal(exe([x.tolist(), labels.tolist()])[0], want)
    with pytest.raises(TypeError, match=r"input 1 \(%labels\).*int64.*float64"):
        exe([x, labels.astype(np.float64)])  # floats are not silently truncated to labels
    with pytest.raises(ValueError, match=r"input 0 \(%x\): expected shape \[4, 3\].*\[3, 4\]"):
        exe([x.T, labels])
    with pytest.raises(TypeError, match=r"input 0 \(%x\)"):
        exe([np.array([["a"] * 3] * 4), labels])
    with pytest.raises(ValueError, match="takes 2 inputs, got 1"):
        exe([x])


def test_profile_and_timings_name_every_kernel(fused_pipeline, capsys, monkeypatch):
    monkeypatch.setenv("EMBER_PASS_TIMING", "1")
    monkeypatch.setenv("EMBER_CACHE", "0")
    em.seed(0)
    model = Mlp()
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend="cpu")
    x, y = batch()
    step(x, y)
    exe = step._last.run
    err = capsys.readouterr().err  # per compile: the IR passes, then the backend's stages
    assert "@train_step IR passes:" in err and "autodiff" in err and "optimize" in err
    from ember.runtime.params import param_table, param_values

    prof = exe.profile([x, y, np.float32(0.1), np.float32(1)][:len(exe.graph.args)],
                       param_values(param_table(model)), repeat=3)
    assert [name for name, _ in prof] == [st.name for st in exe.plan.steps]
    assert all(t >= 0 for _, t in prof)
    assert {"plan", "emit", "optimize", "codegen", "load"} <= set(exe.timings)


def test_a_kernel_timer_runs_one_profiled_call_at_a_time():
    """`exe.kernel_timer(...)`: profile's runs one by one (a benchmark interleaves them with
    other calls), its cycle counter's rate taken against the clock: the kernels' times add
    up to no more than the calls took, and an executable dropped meanwhile stays alive."""
    em.seed(0)
    step = em.compile_train_step(Mlp(), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend="cpu")
    x, y = batch()
    step(x, y)
    exe = step._last.run
    timer = exe.kernel_timer([x, y, 0.1, 1.0][:len(exe.graph.args)], step.params(
        step.param_table()))
    with pytest.raises(ValueError, match="no run"):
        timer.seconds()
    del exe, step
    gc.collect()
    start = time.perf_counter()
    for _ in range(5):
        timer()
    wall = time.perf_counter() - start
    times = timer.seconds()
    assert len(times) == len(timer._exe.plan.steps)
    # per run, with the counter rated: a wrong rate or unit is off by orders of magnitude,
    # which a margin of 50 still sees whatever the machine's load does to `wall`
    assert 0 < sum(t for _, t in times) < 50 * wall / 5


def test_big_results_are_recycled_only_when_released():
    g = Graph("f", [TensorType((300, 300), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.neg", g.args[0])])
    exe = cpu.Executable(verify(g), use_cache=False)
    x = np.ones((300, 300), np.float32)
    first = exe([x])[0]
    view = exe([x * 2])[0].T  # only a view of the second result is kept
    third = exe([x * 3])[0]
    assert not np.shares_memory(first, third) and not np.shares_memory(view, third)
    np.testing.assert_array_equal(first, -x)
    np.testing.assert_array_equal(view, -2 * x)
    addr = third.ctypes.data
    del third
    fourth = exe([x * 4])[0]  # the third's buffer, released, is reused
    assert fourth.ctypes.data == addr
    np.testing.assert_array_equal(fourth, -4 * x)


@pytest.mark.parametrize("dtype,ldtype", [("f32", "i64"), ("f64", "i32")])
@pytest.mark.parametrize("where", [0, 36, 100])  # first element, vector tail, middle
def test_input_checks_run_natively_and_stop_before_any_kernel(dtype, ldtype, where):
    """`ember.finite_args` / `ember.label_args`: one pass over each input in the entry; a
    bad value anywhere (the vectorized body or the scalar tail) raises InputCheckError
    naming the input, and the next good call runs normally."""
    from ember.backends.input_checks import InputCheckError

    g = Graph("f", [TensorType((3, 37), dtype), TensorType((37,), ldtype)])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.neg", g.args[0]), b.op("ember.neg", g.args[1])])
    g.attributes["ember.finite_args"] = [0]
    g.attributes["ember.label_args"] = [[1, 5]]
    exe = cpu.Executable(verify(g), use_cache=False)
    x = np.ones((3, 37), dtype.replace("f", "float"))
    y = np.arange(37, dtype=ldtype.replace("i", "int")) % 5
    np.testing.assert_array_equal(exe([x, y])[0], -x)
    for bad in (np.nan, np.inf, -np.inf):
        xb = x.copy()
        xb.flat[where] = bad
        with pytest.raises(InputCheckError, match="input 0 contains NaN or Inf") as e:
            exe([xb, y])
        assert e.value.arg == 0
    for bad in (5, -1):
        yb = y.copy()
        yb[where % 37] = bad
        with pytest.raises(InputCheckError, match=r"input 1 has labels outside \[0, 5\)"):
            exe([x, yb])
    np.testing.assert_array_equal(exe([x, y])[1], -y)  # the status was reset


def test_bound_call_runs_the_native_code_alone():
    """`exe.bound(inputs)`: what benchmarks time (the GEMM tuner times its GEMMs alone,
    test_cpu_gemm_choice.py). It writes into buffers of its own, never into a result the
    executable handed out, and keeps alive what it reads (a float32 copy of float64 input)."""
    g = Graph("f", [TensorType((5, 7), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.neg", g.args[0])])
    exe = cpu.Executable(verify(g), use_cache=False)
    want = -np.arange(35, dtype=np.float32).reshape(5, 7)
    run = exe.bound([np.arange(35.0).reshape(5, 7)])
    held = exe([want])[0]
    for _ in range(3):
        np.ones(35)  # reuse freed memory, if the bound call had let go of its input
        run()
    (out,) = run.results
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(held, -want)
    assert exe.native_calls == 2  # the bound call is not counted as a step


def test_a_param_bound_again_reads_its_values_now():
    """The last call's param arrays are bound again without a look (the same arrays): a
    value written in place is read, a new array or a converted one (f64 for an f32 param,
    never cached) gives its current values."""
    g = Graph("f", [TensorType((3,), "f32")])
    b = Builder(g.body)
    w = b.create("ember.param", [], {"id": "w", "path": "w"},
                 result_types=[TensorType((3,), "f32")]).result
    b.create("func.return", [b.op("ember.mul", g.args[0], w)])
    exe = cpu.Executable(verify(g), use_cache=False)
    x, w32, w64 = np.ones(3, np.float32), np.full(3, 2, np.float32), np.full(3, 4.0)
    for params, want in (({"w": w32}, 2), ({"w": w32}, 2), ({"w": w64}, 4), ({"w": w64}, 4)):
        np.testing.assert_array_equal(exe([x], params)[0], np.full(3, want, np.float32))
    w32[:] = 5
    w64[:] = 6
    np.testing.assert_array_equal(exe([x], {"w": w32})[0], np.full(3, 5, np.float32))
    np.testing.assert_array_equal(exe([x], {"w": w32})[0], np.full(3, 5, np.float32))
    w32[1] = 7
    np.testing.assert_array_equal(exe([x], {"w": w32})[0], np.array([5, 7, 5], np.float32))
    np.testing.assert_array_equal(exe([x], {"w": w64})[0], np.full(3, 6, np.float32))


def test_run_values_binds_params_by_position_as_the_mapping_does_by_id():
    """`run_values(inputs, values)`: the call a training step makes on every step, with the
    params' values in `param_keys` order; the same results as `exe(inputs, params)`, and a
    missing or extra value is an error, never a stale pointer."""
    g = Graph("f", [TensorType((2, 3), "f32")])
    b = Builder(g.body)
    w, s = (b.create("ember.param", [], {"id": pid, "path": f"layer.{pid}"},
                     result_types=[TensorType(shape, "f32")]).result
            for pid, shape in (("w", (2, 3)), ("s", (3,))))
    b.create("func.return", [b.op("ember.add", b.op("ember.mul", g.args[0], w), s)])
    exe = cpu.Executable(verify(g), use_cache=False)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    params = {"w": np.full((2, 3), 2, np.float32), "s": np.arange(3, dtype=np.float64)}
    assert sorted(exe.param_keys) == ["s", "w"]
    values = [params[k] for k in exe.param_keys]
    (want,) = exe([x], params)
    np.testing.assert_array_equal(want, 2 * x + np.arange(3))
    np.testing.assert_array_equal(exe.run_values([x], values)[0], want)
    with pytest.raises(ValueError, match="takes 2 params, got 1"):
        exe.run_values([x], values[:1])
    with pytest.raises(KeyError, match=r"no value for param .*layer\.s \(id s\)"):
        exe.run_values([x], [None if k == "s" else v for k, v in zip(exe.param_keys, values)])
    with pytest.raises(KeyError, match=r"no value for param .*layer\.w \(id w\)"):
        exe([x], {"s": params["s"]})


def _feedback_graph():
    """f(x, s; w) = (s + x, w * 2, x.sum()): a state `s` (argument 1) and a param `w` that
    a caller feeds back (results 0 and 1), and an input `x` it gives anew or not."""
    g = Graph("f", [TensorType((2, 3), "f32"), TensorType((2, 3), "f32")])
    b = Builder(g.body)
    w = b.create("ember.param", [], {"id": "w", "path": "layer.w"},
                 result_types=[TensorType((2, 3), "f32")]).result
    two = b.op("ember.constant", value=np.array(2, np.float32))
    b.create("func.return", [b.op("ember.add", g.args[1], g.args[0]), b.op("ember.mul", w, two),
                             b.op("ember.reduce_sum", g.args[0], axes=[0, 1],
                                                  keepdims=False)])
    return cpu.Executable(verify(g), use_cache=False)


def test_a_feedback_run_is_run_values_whatever_the_caller_changes():
    """`exe.feedback(feeds)`: results fed back as the next call's inputs are bound once per
    turn, yet every call gives `run_values`' results: a fed value replaced by another
    array, an input changed in place, an input converted (float64), a held result."""
    exe = _feedback_graph()
    run = exe.feedback({0: 1, 1: "w"})
    assert run.carries
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s, w = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    held = []
    for i in range(12):
        want = [s + x, w * 2, x.sum()]
        outs = run([x, s], [w])
        for got, ref in zip(outs, want):
            np.testing.assert_array_equal(got, ref, err_msg=f"call {i}")
        s, w = outs[0], outs[1]
        if i == 3:
            x[0, 0] += 10  # the same array, changed: read again
        if i == 5:
            w = np.full((2, 3), 3, np.float32)  # a param replaced
        if i == 6:
            x = np.arange(6.0).reshape(2, 3)  # converted: a copy made on each call
        if i == 7:
            x[1, 1] = -4.0
        if i in (8, 9):
            held.append((outs[0], outs[0].copy()))  # results a caller keeps
    for value, copy in held:
        np.testing.assert_array_equal(value, copy)  # never written again
    assert exe.native_calls == 12


def test_a_feedback_run_binds_each_turn_once():
    """Only a call whose fed input is not the array the last call returned (the first, one
    after the caller put a copy there) runs the executable's general path, and binds both
    turns again: the others bind no fed input or result."""
    exe = _feedback_graph()
    run = exe.feedback({0: 1, 1: "w"})
    general = []
    plain = exe._run
    exe._run = lambda *a: (general.append(1), plain(*a))[1]
    x = np.ones((2, 3), np.float32)
    s, w = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    for i in range(8):
        if i == 5:
            s = s.copy()
        s, w, _ = run([x, s], [w])
    assert len(general) == 2  # the first (the caller's arrays), the sixth (a copy)
    with pytest.raises(ValueError, match="takes 2 inputs, got 1"):
        run([x], [w])
    with pytest.raises(KeyError, match=r"no value for param layer\.w"):
        run([x, s], [None])


def test_a_feedback_run_never_writes_one_buffer_for_two_results():
    """A caller may feed one array to two inputs (a param tied to another): the next calls
    still write each result into a buffer of its own."""
    g = Graph("f", [TensorType((4,), "f32"), TensorType((4,), "f32")])
    b = Builder(g.body)
    one = b.op("ember.constant", value=np.array(1, np.float32))
    b.create("func.return", [b.op("ember.add", g.args[0], one), b.op("ember.mul", g.args[1], one)])
    exe = cpu.Executable(verify(g), use_cache=False)
    run = exe.feedback({0: 0, 1: 1})
    a, c = np.zeros(4, np.float32), np.zeros(4, np.float32)
    for i in range(6):
        a, c = run([a, c], [])
        if i == 1:
            c = a  # both inputs one (pooled) array
        assert a is not c or i == 1
    np.testing.assert_array_equal(a, np.full(4, 6, np.float32))
    np.testing.assert_array_equal(c, np.full(4, 2, np.float32))


def test_a_compile_llvm_could_not_finish_in_memory_is_a_memory_error(monkeypatch):
    """LLVM aborts the process when an allocation fails inside it (seen under `ulimit -v`:
    'LLVM ERROR: out of memory', exit 134); the room it needs is reserved first, and a
    process that cannot map it gets a MemoryError it can catch."""
    from ember.backends.cpu.machine import jit

    monkeypatch.setattr(jit, "LLVM_BASE_BYTES", 1 << 60)  # more than any process may map
    g = Graph("f", [TensorType((3,), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.neg", g.args[0])])
    with pytest.raises(MemoryError, match="compiling @.* needs about .* MiB"):
        cpu.Executable(verify(g), use_cache=False)
