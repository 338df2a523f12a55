"""Compiled functions over their life: compile_grad under every recompute strategy gives
the gradients of "none" (no larger a plan); the per-shape cache is bounded (least recently
used goes first) and what leaves it, or a deleted function, frees its executables."""

import gc

import numpy as np
import pytest

import ember as em
from ember import nn
from ember.backends.cpu import Executable
from ember.passes.memory import plan_memory


class Deep(nn.Module):
    def __init__(self, width=64, depth=4):
        super().__init__()
        self.layers = [nn.Linear(width, width) for _ in range(depth)]
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = nn.functional.tanh(layer(x))
        return self.head(x)


def batch(n):
    rng = np.random.default_rng(n)
    return rng.standard_normal((n, 64)).astype(np.float32), rng.integers(0, 10, n)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_compile_grad_recomputing_equals_none_with_a_smaller_plan(backend):
    em.seed(0)
    model = Deep()
    x, y = batch(512)  # activations, not params and grads, set the peak
    grads, peaks = {}, {}
    for strategy in ("none", "balanced", "min-cut", "all"):
        f = em.compile_grad(model, nn.functional.cross_entropy, backend=backend,
                            recompute=strategy)
        grads[strategy] = f(x, y)
        peaks[strategy] = plan_memory(f.graph).peak_bytes
        assert ("recompute" in " ".join(f.stages)) == (strategy != "none")
    for strategy, g in grads.items():
        for p in model.parameters():
            np.testing.assert_allclose(g[p.id], grads["none"][p.id], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{strategy}: {p.id}")
    # 4 tanh layers keep one activation each under every strategy: within its step-time
    # cap "all" saves nothing once fused, and the pipeline runs none's schedule for it
    assert all(p <= peaks["none"] for p in peaks.values()), peaks


def test_compile_grad_memory_budget_implies_min_cut_and_an_impossible_one_says_so():
    em.seed(0)
    model = Deep()
    x, y = batch(32)
    f = em.compile_grad(model, nn.functional.cross_entropy, backend="interpreter",
                        memory_budget=10**9)
    assert f.recompute == "min-cut" and f(x, y)
    with pytest.raises(ValueError, match="cannot be met: the best achievable planned peak"):
        em.compile_grad(model, nn.functional.cross_entropy, backend="interpreter",
                        memory_budget=10)(x, y)
    with pytest.raises(ValueError, match="memory_budget must be a positive"):
        em.compile_grad(model, nn.functional.cross_entropy, memory_budget=0)


def live_executables() -> int:
    gc.collect()
    return sum(type(o) is Executable for o in gc.get_objects())


def test_the_shape_cache_keeps_the_most_recent_and_frees_what_it_drops():
    em.seed(0)
    before = live_executables()
    f = em.compile_grad(Deep(depth=1), nn.functional.cross_entropy)
    f.cache_size = 3
    for n in (4, 8, 12, 16, 20):
        f(*batch(n))
    assert len(f._cache) == 3 and live_executables() - before == 3
    f(*batch(12))  # still cached: used, so it is now the most recent
    f(*batch(24))  # evicts 16, the least recently used
    assert [k[0][0][0][0] for k in f._cache] == [20, 12, 24]
    del f
    assert live_executables() == before


def test_a_deleted_train_step_frees_its_executables():
    em.seed(0)
    before = live_executables()
    step = em.compile_train_step(Deep(depth=1), nn.functional.cross_entropy,
                                 em.optim.SGD(lr=0.1))
    for n in (4, 8):
        step(*batch(n))
    assert live_executables() - before == 2
    del step
    assert live_executables() == before


def test_compile_grad_reports_its_memory_like_a_train_step():
    em.seed(0)
    f = em.compile_grad(Deep(), nn.functional.cross_entropy, recompute="all")
    f(*batch(64))
    report = f.memory_report()
    # the report's plan adds the kernels' scratch (packed GEMM panels) to the graph's
    assert report["peak_bytes"] >= plan_memory(f.graph).peak_bytes and report["real_bytes"] > 0


def test_params_are_bound_once_until_one_is_rebound(monkeypatch):
    """The cpu binds a compiled function's params on the first call and again only after a
    Param was rebound (`set_value`), a tree edit replaced one, or its executable ran with
    other arrays; each call's result is the numpy model's of the values it has then."""
    binds = []
    bind = Executable._bind_params
    monkeypatch.setattr(Executable, "_bind_params",
                        lambda self, *a: (binds.append(1), bind(self, *a))[1])
    model = Deep(width=8, depth=1)
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    f = em.compile(model, x)

    def numpy_forward():
        h = np.tanh(x @ model.layers[0].weight.val() + model.layers[0].bias.val())
        return h @ model.head.weight.val() + model.head.bias.val()  # (weights [in, out])

    for _ in range(3):
        np.testing.assert_allclose(f(x), numpy_forward(), rtol=1e-5, atol=1e-6)
    assert len(binds) == 1
    model.head.weight.set_value(np.ones((8, 10), np.float32))
    np.testing.assert_allclose(f(x), numpy_forward(), rtol=1e-5, atol=1e-6)
    f(x)
    assert len(binds) == 2
    f.entry((x,)).run([x], {pid: np.zeros(p.shape, np.float32)
                            for pid, p in f.param_table().items()})
    np.testing.assert_allclose(f(x), numpy_forward(), rtol=1e-5, atol=1e-6)
    assert len(binds) == 4
    model.head = nn.Linear(8, 10)  # (a tree edit: other Params)
    np.testing.assert_allclose(f(x), numpy_forward(), rtol=1e-5, atol=1e-6)


def test_a_function_compiled_for_tensor_specs_runs_arrays_without_recompiling(capsys):
    """A TensorSpec keys its graph as an array of its shape and dtype does."""
    f = em.compile(nn.Linear(4, 3), em.TensorSpec((2, 4), "f32"))
    f(np.zeros((2, 4), np.float32))
    assert len(f._cache) == 1 and "recompiling" not in capsys.readouterr().err


def test_torch_tensors_run_the_graph_compiled_for_arrays(capsys):
    """A torch tensor's dtype is torch's own: keyed as the array it converts to."""
    torch = pytest.importorskip("torch")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    f = em.compile(nn.Linear(4, 3), x)
    want = f(x)
    np.testing.assert_array_equal(f(torch.from_numpy(x)), want)
    assert len(f._cache) == 1 and "recompiling" not in capsys.readouterr().err
