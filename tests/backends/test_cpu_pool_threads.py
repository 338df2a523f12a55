"""Pools on the cpu split their planes (image x channel) across threads
(backends/cpu/kernels/spatial.py `emit_pool`): forward and gradient, overlapping and tiling
windows, with and without padding, equal the interpreter on 1, 2 and 4 threads."""

from __future__ import annotations

import pytest
from fused_checks import close, graph, rand

from ember.backends import cpu, interpreter
from ember.backends.cpu.parallel import outline as cpu_threads

X = (2, 5, 13, 11)  # 10 planes: 4 threads take 3, 3, 2, 2


def _pool(kind: str, kernel: int, stride: int, padding: int):
    attrs = {"kernel": [kernel] * 2, "stride": [stride] * 2, "padding": [padding] * 2}

    def fn(b, x, g):
        if kind == "max":
            return [b.op("ember.max_pool2d", x, **attrs)]
        if kind == "avg":
            return [b.op("ember.avg_pool2d", x, **attrs)]
        if kind == "max_grad":
            return [b.op("ember.max_pool2d_grad", x, g, **attrs)]
        return [b.op("ember.avg_pool2d_grad", g, input_shape=list(X), **attrs)]
    return fn


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("kernel,stride,padding", [(3, 2, 1), (2, 2, 0), (3, 1, 0)])
@pytest.mark.parametrize("kind", ["max", "avg", "max_grad", "avg_grad"])
def test_a_pool_split_by_planes_equals_the_interpreter(kind, kernel, stride, padding,
                                                       threads, monkeypatch):
    monkeypatch.setattr(cpu_threads, "MIN_WORK", 64)  # (so that this small pool splits)
    oh = (X[2] + 2 * padding - kernel) // stride + 1
    ow = (X[3] + 2 * padding - kernel) // stride + 1
    shapes = [X, (X[0], X[1], oh, ow)]
    g = graph(shapes, _pool(kind, kernel, stride, padding))
    exe = cpu.Executable(g, threads, use_cache=False)
    assert (".planes.chunk" in exe.llvm_ir) == (threads > 1)
    inputs = rand(*shapes)
    close(exe(inputs), interpreter.run(g, inputs))
