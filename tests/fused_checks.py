"""The fused-kernel tests' shared checks (tests/backends/test_cpu_fused*.py): a graph built
in code, fused as the pipeline fuses it, and run four ways (interpreter unfused, the
reference; interpreter fused; cpu unfused; cpu fused), which must agree to 1e-5
relative."""

from __future__ import annotations

import numpy as np

from ember.backends import cpu, interpreter
from ember.ir import Builder, Graph, TensorType, verify
from ember.passes import PassManager, parse_pipeline

RTOL = 1e-5


def fuse(g: Graph) -> Graph:
    from ember.ir.parser import parse

    return PassManager(parse_pipeline("fuse"), verify_each=True).run(parse(str(g)))


def kernels(g: Graph) -> list[str]:
    return [op.name for op in g.ops if op.name.startswith(("kernel.", "ember."))
            and op.name not in ("ember.param", "ember.constant")]


def close(got, want, what=""):
    assert len(got) == len(want)
    for k, (x, y) in enumerate(zip(got, want)):
        assert x.shape == y.shape and x.dtype == y.dtype, (what, k, x.shape, y.shape)
        scale = float(np.max(np.abs(y))) if y.size else 1.0
        np.testing.assert_allclose(x, y, rtol=RTOL, atol=RTOL * max(scale, 1.0),
                                   err_msg=f"{what} output {k}")


def four_ways(g: Graph, inputs, threads=None):
    """All four runs agree; returns the fused graph."""
    want = interpreter.run(g, inputs)
    f = fuse(g)
    close(interpreter.run(f, inputs), want, "interpreter fused")
    close(cpu.Executable(g, threads, use_cache=False)(inputs), want, "cpu unfused")
    close(cpu.Executable(f, threads, use_cache=False)(inputs), want, "cpu fused")
    return f


def graph(arg_shapes, fn, dtype="f32") -> Graph:
    g = Graph("f", [TensorType(tuple(s), dtype) for s in arg_shapes])
    b = Builder(g.body)
    b.create("func.return", list(fn(b, *g.args)))
    return verify(g)


def rand(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
