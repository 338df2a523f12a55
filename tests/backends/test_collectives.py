"""`ember.allreduce` (SyncBatchNorm's sums): the identity in one process, the installed
reducer inside `collectives.using`, and a reducer's error raised after a native run."""

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.backends import collectives, cpu, interpreter
from ember.ir import Builder, Graph, TensorType


def graph(dtype: str) -> Graph:
    g = Graph("f", [TensorType((3, 4), dtype)])
    b = Builder(g.body)
    y = b.op("ember.allreduce", g.args[0])
    b.create("func.return", [b.op("ember.mul", y, y)])
    return g


RUNNERS = {"interpreter": lambda g: lambda xs: interpreter.run(g, xs),
           "cpu": lambda g: cpu.Executable(g, use_cache=False)}


@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("backend", RUNNERS)
def test_allreduce_is_the_reducers_sum_and_else_the_value(backend, dtype):
    x = np.arange(12, dtype=dtype.replace("f", "float")).reshape(3, 4)
    run = RUNNERS[backend](graph(dtype))
    np.testing.assert_array_equal(run([x])[0], x * x)
    with collectives.using(lambda a: a.__imul__(3)):  # three ranks holding x
        np.testing.assert_array_equal(run([x])[0], 9 * x * x)
    np.testing.assert_array_equal(run([x])[0], x * x)  # the reducer is gone again


def test_a_reducer_error_inside_native_code_is_raised_after_the_call():
    run = cpu.Executable(graph("f32"), use_cache=False)

    def dead_peer(a):
        raise RuntimeError("peer 1 died")

    with pytest.raises(RuntimeError, match="peer 1 died"), collectives.using(dead_peer):
        run([np.ones((3, 4), np.float32)])
    run([np.ones((3, 4), np.float32)])  # and the next run is clean


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_sync_batchnorm_in_one_process_trains_as_batchnorm(backend):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 6)).astype(np.float32), rng.integers(0, 4, 16)
    finals = []
    for sync in (False, True):
        em.seed(0)
        m = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8, sync=sync), nn.ReLU(),
                          nn.Linear(8, 4))
        step = em.compile_train_step(m, nn.functional.cross_entropy,
                                     optim.SGD(lr=0.1, momentum=0.9), backend=backend)
        losses = [step(x, y) for _ in range(5)]
        finals.append((losses, [p.val() for _, p in m.all_params() if p.kind != "flag"]))
    np.testing.assert_allclose(finals[0][0], finals[1][0], rtol=1e-6)
    for a, b in zip(finals[0][1], finals[1][1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
