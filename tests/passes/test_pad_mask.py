"""`pad-mask` on traced graphs: with NaN at every padded position (garbage a real graph
may hold: the pass must select, never multiply), the real positions of every result equal
the unpadded graph's, run on the numpy interpreter; what it cannot mask it refuses."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from ember import nn
from ember.backends import interpreter
from ember.frontend.trace import TensorSpec, trace_function
from ember.passes.manager import PassManager, PipelineError, parse_pipeline
from ember.passes.pad_mask import PadMaskError
from ember.runtime.dynamic import cut

F = nn.functional
BUCKET = 8


def traced(fn, specs: list[TensorSpec], padded: dict[int, int]):
    """`fn` traced on `specs` plus a length argument, marked as the runtime marks it:
    input i padded along axis `padded[i]`."""
    graph = trace_function(lambda *xs: fn(*xs[:-1]), None, [*specs, TensorSpec((), "i64")])
    graph.attributes["ember.padded_args"] = [[i, a, "T"] for i, a in padded.items()]
    graph.attributes["ember.length_args"] = [["T", len(specs)]]
    return graph


def run_padded(fn, inputs: list[np.ndarray], padded: dict[int, int]) -> list[np.ndarray]:
    """`fn` on `inputs` padded to BUCKET with NaN (or the largest int), after pad-mask and
    the inference lowering; results cut back to the real length."""
    t = inputs[0].shape[padded[0]]
    big = []
    for i, x in enumerate(inputs):
        if i in padded:
            shape = list(x.shape)
            shape[padded[i]] = BUCKET
            fill = np.nan if x.dtype.kind == "f" else 0
            y = np.full(shape, fill, x.dtype)
            y[tuple(slice(0, n) for n in x.shape)] = x
            x = y
        big.append(x)
    graph = traced(fn, [TensorSpec.of(x) for x in big], padded)
    graph = PassManager(parse_pipeline("pad-mask,decompose,canonicalize,cse,dce"),
                        verify_each=True).run(graph)
    outs = interpreter.run(graph, [*big, np.asarray(t, np.int64)])
    for i, axis, _, inner, bucket in graph.attributes["ember.padded_results"]:
        outs[i] = cut(outs[i], axis, inner, bucket, t)
    return outs


def run_exact(fn, inputs: list[np.ndarray]) -> list[np.ndarray]:
    graph = trace_function(fn, None, [TensorSpec.of(x) for x in inputs])
    return interpreter.run(graph, inputs)


def x3(t: int = 5) -> np.ndarray:
    return np.random.default_rng(t).standard_normal((2, t, 3))


CASES = {
    "mean": lambda x: x.mean(axis=1),
    "sum_all": lambda x: (x * 2.0).sum(),
    "max": lambda x: x.max(axis=(0, 1)),
    "softmax": lambda x: F.softmax(x, axis=1),
    "log_softmax_then_sum": lambda x: F.log_softmax(x, axis=1).sum(axis=1),
    "flat_mean": lambda x: x.reshape(2, x.shape[1] * 3).mean(axis=1),
    "flat_rows": lambda x: x.reshape(2 * x.shape[1], 3).mean(axis=0),
    "gram": lambda x: x.transpose(0, 2, 1) @ x,
    "causal": lambda x: F.scaled_dot_product_attention(x, x, x, causal=True),
    "bidirectional": lambda x: F.scaled_dot_product_attention(x, x * 0.5, x),
    "mean_mean": lambda x: x.mean(axis=1, keepdims=True) - x,
    "slice_other_axes": lambda x: x[:, :, 1:].sum(axis=1) + x[..., ::2].max(axis=(0, 1)),
    "index_batch": lambda x: F.softmax(x[1], axis=0),  # T moves to axis 0
    "unslice_other_axis": lambda x: x.trace.op("ember.unslice", x, start=[0, 0, 1],
                                               step=[1, 1, 2], shape=[2, x.shape[1], 7]
                                               ).mean(axis=1),
    "cat_other_axes": lambda x: em.cat([x, x * 2.0], 2).mean(axis=1) + em.cat([x, x], 0).sum(),
    "split": lambda x: sum(p.sum(axis=1) * (i + 1.0) for i, p in enumerate(x.split([1, 2], 2))),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("t", [1, 5, 8])
def test_real_positions_equal_the_unpadded_graph(name, t):
    fn, x = CASES[name], x3(t)
    got, want = run_padded(fn, [x], {0: 1}), run_exact(fn, [x])
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ignore", [None, 2])
def test_cross_entropy_over_padded_rows(ignore):
    """Labels [2, T] and logits [2, T, 4] flattened to rows: the mean over real rows."""
    t = 5
    logits = np.random.default_rng(0).standard_normal((2, t, 4))
    labels = np.random.default_rng(1).integers(0, 4, (2, t))

    def loss(z, y):
        kw = {} if ignore is None else {"ignore_index": ignore}
        return F.cross_entropy(z.reshape(2 * z.shape[1], 4), y.reshape(2 * z.shape[1]), **kw)

    got = run_padded(loss, [logits, labels], {0: 1, 1: 1})
    np.testing.assert_allclose(got[0], run_exact(loss, [logits, labels])[0], rtol=1e-12)


def refusal(fn, specs, padded) -> str:
    graph = traced(fn, specs, padded)
    with pytest.raises(PadMaskError) as e:
        PassManager(parse_pipeline("pad-mask")).run(graph)
    return str(e.value)


def test_what_it_cannot_mask_it_refuses():
    spec = TensorSpec((2, BUCKET, 3), "f64")
    assert "is split across result axes" in refusal(
        lambda x: x.reshape(2, BUCKET // 2, 6).sum(axis=1), [spec], {0: 1})
    assert "keys are padded unlike its queries" in refusal(
        lambda x, q: F.scaled_dot_product_attention(q, x, x, causal=True),
        [spec, TensorSpec((2, 4, 3), "f64")], {0: 1})
    assert "normalizes over a padded axis" in refusal(
        lambda x: F.layer_norm(x.transpose(0, 2, 1), (BUCKET,)), [spec], {0: 1})
    message = refusal(lambda x: F.max_pool2d(x.reshape(1, 2, BUCKET, 3), 2), [spec], {0: 1})
    assert "an op the pass does not know" in message and "test_pad_mask.py" in message


CUTS = {  # what cuts or joins the padded axis T, and what the refusal says it does
    "last": (lambda x: x[:, -1], "slicing"),
    "shift": (lambda x: x[:, 1:] - x[:, :-1], "slicing"),
    "every_other": (lambda x: x[:, ::2], "slicing"),
    "cat": (lambda x: em.cat([x, x], 1), "concatenating"),
    "unslice": (lambda x: x.trace.op("ember.unslice", x, start=[0, 1, 0], step=[1, 1, 1],
                                     shape=[2, BUCKET + 2, 3]), "padding (unslice)"),
}


@pytest.mark.parametrize("name", CUTS)
def test_cutting_or_joining_the_padded_axis_is_refused(name):
    """Bounds traced on the bucket would read padding as data (x[:, -1] is padding)."""
    fn, doing = CUTS[name]
    message = refusal(fn, [TensorSpec((2, BUCKET, 3), "f64")], {0: 1})
    assert f"{doing} along the dynamic dim T (axis 1) is not supported" in message
    assert "test_pad_mask.py" in message


def test_runs_on_the_traced_graph_only():
    graph = traced(lambda x: x.sum(), [TensorSpec((BUCKET,), "f64")], {0: 0})
    graph.attributes["ember.grads"] = []
    with pytest.raises(PipelineError, match="before autodiff"):
        PassManager(parse_pipeline("pad-mask")).run(graph)
