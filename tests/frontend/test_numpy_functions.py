"""numpy's functions and ufuncs on traced Tensors (NEP 18 `__array_function__`, NEP 13
`__array_ufunc__`): each mapped one, written once and run both on a numpy array and inside
a traced `forward` (interpreter and cpu), gives numpy's values and dtype; `array + tensor`
and `tensor + array` keep working; a gradient flows through `np.concatenate`; anything
unmapped is one TypeError naming the function and what to write instead, and bad axes are
ember's ShapeError, never a numpy error from inside numpy."""

from __future__ import annotations

import numpy as np
import pytest
from small_models import Fn

import ember as em
from ember import nn

X = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
W = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
ROW = np.arange(4, dtype=np.float32)


CASES = {  # name: f, called on X itself for numpy's answer and on the traced input
    "concatenate": lambda x: np.concatenate([x, x * 2.0], axis=1),
    "concatenate(-1) with an array": lambda x: np.concatenate(
        [x, np.ones((2, 3, 1), np.float32)], -1),
    "concatenate(axis=None)": lambda x: np.concatenate([x, -x], axis=None),
    "stack": lambda x: np.stack([x, np.exp(x)], axis=1),
    "stack(-1)": lambda x: np.stack((x, x), -1),
    "split(sections)": lambda x: np.split(x, 2, axis=2),
    "split(indices)": lambda x: np.split(x, [1, 3], axis=-1),
    "split(negative index)": lambda x: np.split(x, [-3, 2], 2),
    "split(axis 0)": lambda x: np.split(x, [1])[1],
    "array_split": lambda x: np.array_split(x, 3, axis=-1),
    "where": lambda x: np.where(x > 0, x, 0.0),
    "where(nonzero is true)": lambda x: np.where(np.maximum(x, 0.0), 1.0, x),
    "where(two scalars)": lambda x: np.where(x > 0, 1.0, 0.0),
    "exp": np.exp,
    "sign": np.sign,
    "log": lambda x: np.log(np.abs(x) + 1.0),
    "sqrt": lambda x: np.sqrt(np.abs(x)),
    "abs": np.abs,
    "tanh": np.tanh,
    "negative": np.negative,
    "square": np.square,
    "maximum": lambda x: np.maximum(x, 0.0),
    "maximum(scalar first)": lambda x: np.maximum(0.0, x),
    "minimum": lambda x: np.minimum(x, -x),
    "add": lambda x: np.add(x, 2.0),
    "subtract(scalar, x)": lambda x: np.subtract(1.0, x),
    "multiply": lambda x: np.multiply(x, x),
    "true_divide": lambda x: np.true_divide(x, 4.0),
    "divide(numpy scalar, x)": lambda x: np.divide(np.float32(1), np.abs(x) + 1.0),
    "power": lambda x: np.power(np.abs(x), 1.5),
    "greater": lambda x: np.greater(x, 0.5),
    "less_equal(array, x)": lambda x: np.less_equal(ROW, x),
    "equal": lambda x: np.equal(x, np.maximum(x, 0.0)),
    "not_equal": lambda x: np.not_equal(np.minimum(x, 0.0), x),
    "clip": lambda x: np.clip(x, -0.5, 0.5),
    "clip(None, max)": lambda x: np.clip(x, None, 0.2),
    "sum(axis, keepdims)": lambda x: np.sum(x, axis=1, keepdims=True),
    "sum(axes)": lambda x: np.sum(x, (0, 2)),
    "sum(dtype)": lambda x: np.sum(x, dtype=np.float64),
    "mean": lambda x: np.mean(x, -1),
    "max": lambda x: np.max(x, axis=0),
    "amax(keepdims)": lambda x: np.amax(x, 1, keepdims=True),
    "min": np.min,
    "amin": lambda x: np.amin(x, axis=-1),
    "argmax": lambda x: np.argmax(x, axis=1),
    "argmin": np.argmin,
    "argmax(keepdims)": lambda x: np.argmax(x, -1, keepdims=True),
    "cumsum": lambda x: np.cumsum(x, axis=1),
    "cumsum(flattened)": np.cumsum,
    "reshape": lambda x: np.reshape(x, (6, -1)),
    "ravel": np.ravel,
    "transpose": np.transpose,
    "transpose(axes)": lambda x: np.transpose(x, (1, 0, 2)),
    "transpose(negative axes)": lambda x: np.transpose(x, (-1, 0, 1)),
    "swapaxes": lambda x: np.swapaxes(x, 0, -1),
    "expand_dims": lambda x: np.expand_dims(x, 1),
    "expand_dims(tuple)": lambda x: np.expand_dims(x, (0, -1)),
    "squeeze": lambda x: np.squeeze(np.expand_dims(x, (0, 2))),
    "squeeze(axis)": lambda x: np.squeeze(np.expand_dims(x, 2), axis=2),
    "matmul": lambda x: np.matmul(x, np.swapaxes(x, -1, -2)),
    "tensor @ array": lambda x: x @ W,
    "array @ tensor": lambda x: np.ones((3, 3), np.float32) @ x,
    "dot": lambda x: np.dot(np.reshape(x, (6, 4)), W),
    "dot(1-D, 2-D)": lambda x: np.dot(np.ones(6, np.float32), np.reshape(x, (6, 4))),
    "dot(scalar)": lambda x: np.dot(x, np.float32(2)),
    "tril": np.tril,
    "triu(1)": lambda x: np.triu(x, 1),
    "tril(-1)": lambda x: np.tril(x, -1),
    "tile": lambda x: np.tile(x, 2),
    "tile(more reps than dims)": lambda x: np.tile(x, (2, 1, 1, 2)),
    "broadcast_to": lambda x: np.broadcast_to(x, (5, 2, 3, 4)),
    "var": lambda x: np.var(x, axis=1),
    "std(ddof, keepdims)": lambda x: np.std(x, axis=-1, ddof=1, keepdims=True),
    "var(all)": np.var,
    "shape, ndim, size": lambda x: np.reshape(x, (np.shape(x)[0] * np.ndim(x),
                                                  np.size(x) // 6)),
    "array + tensor": lambda x: ROW + x,
    "tensor + array": lambda x: x + ROW,
    "array - tensor": lambda x: ROW - x,
    "tensor * array": lambda x: x * ROW,
    "array / tensor": lambda x: ROW / (np.abs(x) + 1.0),
    "array < tensor": lambda x: ROW < x,
    "numpy scalar * tensor": lambda x: np.float32(3) * x,
}


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("name", CASES)
def test_a_numpy_function_means_what_it_means_in_numpy(name, backend):
    f = CASES[name]
    got, want = em.compile(Fn(f), X, backend=backend)(X), f(X)
    pairs = list(zip(got, want, strict=True)) if isinstance(want, list) else [(got, want)]
    for g, w in pairs:
        w = np.asarray(w)
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_traced_call_records_ember_ops():
    text = str(em.trace(Fn(lambda x: np.concatenate([x, ROW + x], 1)), X))
    assert "ember.concat" in text and "ember.add" in text


REFUSED = {  # name: (f, what the TypeError says)
    "np.fft.fft": (lambda x: np.fft.fft(x), r"^np\.fft\.fft is not supported on traced ember "
                   r"Tensors; ember has no FFT op$"),
    "np.einsum": (lambda x: np.einsum("ijk->ik", x), r"^np\.einsum is not supported .*@"),
    "np.sort": (np.sort, r"^np\.sort is not supported .*no sort"),
    "np.sin (a ufunc)": (np.sin, r"^np\.sin is not supported on traced ember Tensors; write "
                         r"it with ember's ops .* np\.concatenate, .* np\.where"),
    "np.where(condition)": (lambda x: np.where(x > 0), r"^np\.where\(condition\) is not "
                            r"supported .*depends on the data.*em\.where"),
    "np.add.reduce": (np.add.reduce, r"^np\.add\.reduce is not supported .*np\.sum"),
    "out=": (lambda x: np.sum(x, out=np.zeros(3)),
             r"^np\.sum\(out=\.\.\.\) is not supported .*it takes a, axis, dtype, keepdims"),
    "initial=": (lambda x: np.max(x, initial=0.0), r"^np\.max\(initial=\.\.\.\) is not"),
    "a ufunc's out=": (lambda x: np.exp(x, out=np.empty(X.shape)),
                       r"^np\.exp\(out=\.\.\.\) is not supported"),
    "order='F'": (lambda x: np.reshape(x, -1, order="F"),
                  r"^np\.reshape\(order='F'\) is not supported"),
    "np.dot of 3-D": (lambda x: np.dot(x, x), r"^np\.dot of arrays with more than 2 dims is "
                      r"not supported.*np\.matmul"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_an_unmapped_function_is_one_typeerror_naming_it_and_what_to_use(name):
    f, message = REFUSED[name]
    with pytest.raises(TypeError, match=message):
        em.trace(Fn(f), X)


def test_an_in_place_operator_on_an_array_says_to_assign():
    def f(x):
        a = np.ones(4, np.float32)
        a += x
        return a

    with pytest.raises(TypeError, match=r"^np\.add\(out=\.\.\.\) is not supported .*assign"):
        em.trace(Fn(f), X)


@pytest.mark.parametrize("f, message", [
    (lambda x: np.concatenate([x, x], axis=3), r"dim 3 is out of range for \[2, 3, 4\]"),
    (lambda x: np.concatenate([x, x[:, :1, :2]], 1), r"ember\.concat"),
    (lambda x: np.stack([x, x], 4), r"dim 4 is out of range"),
    (lambda x: np.split(x, 3, axis=-1), r"np\.split: 3 sections cannot split dim 2 of "
                                        r"\[2, 3, 4\] equally"),
    (lambda x: np.split(x, [3, 1], axis=2), r"np\.split: indices \[3, 1\] .* must not "
                                            r"decrease"),
    (lambda x: np.squeeze(x, axis=0), r"np\.squeeze: axis 0 of \[2, 3, 4\] has size 2"),
    (lambda x: np.expand_dims(x, 4), r"dim 4 is out of range"),
    (lambda x: np.transpose(x, (0, 1, 5)), r"dim 5 is out of range"),
    (lambda x: np.argmax(x, axis=3), r"dim 3 is out of range"),
    (lambda x: np.swapaxes(x, 0, -4), r"dim -4 is out of range"),
])
def test_bad_axes_and_shapes_are_embers_shape_error_not_numpys(f, message):
    with pytest.raises(em.ShapeError, match=message) as e:
        em.trace(Fn(f), X)
    assert "test_numpy_functions.py" in str(e.value)  # at a line of this file


class Joined(nn.Module):
    """np.concatenate of a param p (so its gradient is checked) and the input."""

    def __init__(self):
        super().__init__()
        self.p = em.Param.from_array(X.astype(np.float64))

    def forward(self, w):
        y = np.concatenate([self.p, np.exp(w), self.p * 2.0], axis=-1)
        return np.concatenate([np.tanh(y), y], axis=None)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_the_gradient_through_concatenate_equals_finite_differences(backend):
    model, w = Joined(), X[:, :, :2].astype(np.float64)
    run = em.compile(model, w, backend="interpreter")
    r = np.random.default_rng(2).standard_normal(run(w).shape)
    grad = em.compile_grad(model, lambda out, _: (out * r).sum(), backend=backend)(w, w)
    num, eps = np.zeros_like(X, np.float64), 1e-6
    for i in np.ndindex(X.shape):
        for sign in (1, -1):
            x = X.astype(np.float64)
            x[i] += sign * eps
            model.p.data = x
            num[i] += sign * (run(w) * r).sum() / (2 * eps)
    np.testing.assert_allclose(grad[model.p], num, rtol=1e-6, atol=1e-8)


def test_numpy_functions_take_params_as_their_traced_tensors():
    """`np.exp(self.w)`, `np.concatenate([self.w, x])` and `array * self.w` in forward."""

    class WithParam(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = em.Param.from_array(np.arange(6.0, dtype=np.float32).reshape(2, 3))

        def forward(self, x):
            return np.concatenate([np.exp(self.w), x], 0) + np.ones((1, 3), np.float32) * self.w[0]

    x = np.ones((2, 3), np.float32)
    w = np.arange(6.0).reshape(2, 3)
    want = np.concatenate([np.exp(w), x], 0) + w[0]
    np.testing.assert_allclose(em.compile(WithParam(), x, backend="cpu")(x), want, rtol=1e-6)
