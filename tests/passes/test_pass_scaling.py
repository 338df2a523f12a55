"""Passes scale linearly: each runs on graphs of n and 4n ops and the growth of its work is
checked (linear is 4, quadratic 16). Work is counted, not timed: the Python lines the pass
executes (and the calls it makes), which are the same on any machine under any load (a
timed version failed on loaded CI machines). What a count cannot see is a loop inside C (a
`list.remove` or `x in a_list` per op): such a pass still looks linear here."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from model_graphs import mlp

from ember.ir import Builder, Graph, TensorType
from ember.passes.manager import PassManager, parse_pipeline

T = TensorType


def chain(n: int, d: int = 16) -> Graph:
    """About n ops: tanh -> mul by a constant, with a matmul every few ops (fuse groups)."""
    g = Graph("chain", [T((d, d), "f32")], ["x"])
    b = Builder(g.body)
    x = g.args[0]
    w = b.create("ember.param", [], {"id": "w", "path": "w"},
                 result_types=[T((d, d), "f32")]).result
    for i in range(n // 4):
        x = b.op("ember.mul", b.op("ember.tanh", x),
                 b.op("ember.constant", value=np.array(0.5, dtype=np.float32)))
        if i % 2:
            x = b.op("ember.matmul", x, w)
    b.create("func.return", [b.op("ember.reduce_sum", x, axes=[0, 1], keepdims=False)])
    return g


def params(n: int, d: int = 8) -> Graph:
    """About n ops: n/3 params, each multiplied into x and summed (the optimizer's shape)."""
    g = Graph("params", [T((d,), "f32")], ["x"])
    b = Builder(g.body)
    acc = None
    for j in range(n // 3):
        p = b.create("ember.param", [], {"id": f"p{j}", "path": f"p{j}"},
                     result_types=[T((d,), "f32")]).result
        y = b.op("ember.mul", g.args[0], p)
        acc = y if acc is None else b.op("ember.add", acc, y)
    b.create("func.return", [b.op("ember.reduce_sum", acc, axes=[0], keepdims=False)])
    return g


def training(n: int) -> Graph:
    """About n ops once differentiated: a deep, narrow MLP (Linear -> GELU blocks) with a
    cross-entropy loss, whose joint graph has every kind of op the training passes see."""
    return mlp(blocks=max(1, n // 60), width=16, batch=8).graph


TRAIN = "decompose,autodiff"
STEP = TRAIN + ",optimizer{kind=adamw},canonicalize,cse,dce"


def events(fn) -> int:
    """Python events (lines, calls, returns) that `fn()` executes."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def work(make, n: int, pipeline: str, before: str) -> int:
    """The events of the pass on a fresh graph of about n ops."""
    g = make(n)
    if before:
        g = PassManager(parse_pipeline(before)).run(g)
    pm = PassManager(parse_pipeline(pipeline))
    return events(lambda: pm.run(g))


def test_the_count_sees_a_quadratic_loop():
    """What the bound below relies on: a loop over pairs grows 16x for 4x the items."""
    def pairs(n):
        return sum(1 for i in range(n) for j in range(n) if i < j)

    assert events(lambda: pairs(400)) / events(lambda: pairs(100)) > 15


@pytest.mark.parametrize("make, n, pipeline, before", [
    (chain, 500, "canonicalize", ""),
    (params, 300, "optimizer{kind=sgd}", "autodiff"),
    (training, 500, "optimizer{kind=adamw}", TRAIN),
    (training, 500, "canonicalize", TRAIN + ",optimizer{kind=adamw}"),
    (training, 500, "cse", TRAIN + ",optimizer{kind=adamw}"),
    (training, 500, "recompute{strategy=balanced}", TRAIN),
    (training, 500, "recompute{strategy=all}", TRAIN),
    (training, 500, "fuse", STEP),
    (training, 500, "plan-memory", STEP),
    (training, 500, "plan-memory", STEP + ",fuse"),
], ids=lambda p: p if isinstance(p, str) else None)
def test_pass_work_grows_linearly(make, n, pipeline, before):
    """The bound, 6, is well above linear (4; the memory planner is n log n, about 5 per
    4x of its buffer operations) and far below quadratic (16)."""
    ratio = work(make, 4 * n, pipeline, before) / work(make, n, pipeline, before)
    assert ratio <= 6, f"{pipeline}: 4x the ops took {ratio:.1f}x the work"
