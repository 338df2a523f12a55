"""The finite-difference harness the autodiff tests share: build `loss = sum(fn(*args) * r)`
with chosen args as params, differentiate it, and compare with central differences."""

from __future__ import annotations

import numpy as np

from ember.backends import interpreter
from ember.ir import Builder, Graph, TensorType, dtype_of, verify
from ember.passes.autodiff import Autodiff
from ember.passes.decompose import Decompose

NP = {"f32": np.float32, "f64": np.float64}


def param(b: Builder, shape, name: str, dtype="f64", **attrs):
    return b.create("ember.param", [], {"id": name, "path": name, **attrs},
                    result_types=[TensorType(tuple(shape), dtype)]).result


def build(fn, args: list[np.ndarray], wrt: set[int], dtype: str = "f64", seed: int = 0) -> Graph:
    """loss = sum(fn(*args) * r): args in `wrt` are params `p<i>`, the rest graph inputs."""
    g = Graph("f", [TensorType(a.shape, dtype_of(a.dtype))
                    for i, a in enumerate(args) if i not in wrt])
    b, inputs = Builder(g.body), iter(g.args)
    vals = [param(b, a.shape, f"p{i}", dtype) if i in wrt else next(inputs)
            for i, a in enumerate(args)]
    out = fn(b, *vals)
    r = np.random.default_rng(seed).normal(size=out.type.shape).astype(NP[dtype])
    prod = b.op("ember.mul", out, b.op("ember.constant", value=np.asarray(r)))
    b.create("func.return", [b.op("ember.reduce_sum", prod, axes=list(range(out.type.rank)),
                                  keepdims=False)])
    return g


def gradients(fn, args, wrt, dtype="f64", decompose=False, seed: int = 0):
    """(run, inputs, params, grads) of sum(fn * r) with respect to the args in `wrt`;
    `run.graph` is the differentiated graph."""
    args = [np.asarray(a, NP[dtype]) if np.asarray(a).dtype.kind == "f" else np.asarray(a)
            for a in args]
    graph = build(fn, args, set(wrt), dtype, seed)
    graph = verify(Autodiff().apply(Decompose().apply(graph) if decompose else graph))
    if decompose:
        assert not any(op.name.startswith("nn.") for op in graph.ops)
    params = {f"p{i}": args[i] for i in wrt}
    assert graph.attributes["ember.grads"] == sorted(params, key=lambda k: int(k[1:]))
    inputs = [a for i, a in enumerate(args) if i not in wrt]
    run = interpreter.compile(graph)
    _, *grads = run(inputs, params)
    return run, inputs, params, dict(zip(graph.attributes["ember.grads"], grads))


def grad_check(fn, args, wrt, decompose=False, eps=1e-6, rtol=1e-5, atol=1e-7,
               seed: int = 0) -> Graph:
    """Assert the gradients of sum(fn * r) equal central differences (float64)."""
    run, inputs, params, grads = gradients(fn, args, wrt, decompose=decompose, seed=seed)
    for pid, grad in grads.items():
        p = params[pid]
        assert grad.shape == p.shape
        numeric = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            hi, lo = p.copy(), p.copy()
            hi[idx] += eps
            lo[idx] -= eps
            numeric[idx] = (run(inputs, {**params, pid: hi})[0]
                            - run(inputs, {**params, pid: lo})[0]) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=rtol, atol=atol, err_msg=pid)
    return run.graph
