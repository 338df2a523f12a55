"""Indexing, joining, splitting and the torch functions ember composes (tril, triu,
cumsum, argmax, max(dim), repeat) as a PyTorch user writes them inside `forward`: values
and gradients against torch on the interpreter and cpu, gradients against finite
differences without torch, and the shape errors of bad indices and joins."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

import ember as em
from ember import nn

X = np.random.default_rng(0).standard_normal((2, 3, 4))
W = np.random.default_rng(1).standard_normal((5, 4))
ROWS = np.array([[2, 0], [1, 2]])
MASK = np.array([True, False, True])


class Fn(nn.Module):
    """fn(p, w) of a param p (so its gradient is the input's) and a second tensor w."""

    def __init__(self, fn, dtype=np.float32):
        super().__init__()
        self.fn = fn
        self.p = em.Param.from_array(X.astype(dtype))

    def forward(self, w):
        return self.fn(self.p, w)


CASES = {  # name: f(x, w), written once for ember and torch (the same spellings)
    "x[:, 1:3]": lambda x, w, m: x[:, 1:3],
    "x[..., ::2]": lambda x, w, m: x[..., ::2],
    "x[:, -1]": lambda x, w, m: x[:, -1],
    "x[:, -1, :]": lambda x, w, m: x[:, -1, :],
    "x[None, 0, 1:]": lambda x, w, m: x[None, 0, 1:],
    "x[1, :, None, 1::2]": lambda x, w, m: x[1, :, None, 1::2],
    "x[..., 1]": lambda x, w, m: x[..., 1],
    "x[:, rows]": lambda x, w, m: x[:, m.tensor(ROWS)],
    "x[[1, 0, 1]] (repeated rows)": lambda x, w, m: x[[1, 0, 1]],
    "x[:, mask]": lambda x, w, m: x[:, m.tensor(MASK)],
    "x[1, :, [0, 3]] (separated)": lambda x, w, m: x[1, :, [0, 3]],
    "x[-1, -2:]": lambda x, w, m: x[-1, -2:],
    "cat": lambda x, w, m: m.cat([x, x[:, :1] * 2.0, x.exp()], 1),
    "cat(dim=-1)": lambda x, w, m: m.cat([x[..., :1], x], dim=-1),
    "stack": lambda x, w, m: m.stack([x[0], x[1] * 3.0], -1),
    "split(size)": lambda x, w, m: x.split(3, -1)[1] * 2.0 + x.split(3, -1)[0][..., :1],
    "split(sizes)": lambda x, w, m: x.split([1, 2], 1)[1],
    "chunk": lambda x, w, m: x.chunk(2, -1)[0] - x.chunk(2, -1)[1],
    "unbind": lambda x, w, m: x.unbind(1)[2] * x.unbind(1)[0],
    "repeat": lambda x, w, m: x.repeat(2, 1, 1, 3),
    "tril": lambda x, w, m: m.tril(x, -1),
    "triu": lambda x, w, m: m.triu(x, 1),
    "cumsum": lambda x, w, m: x.cumsum(-1),
    "cumsum(1)": lambda x, w, m: x.cumsum(1) * x,
    "max(dim).values": lambda x, w, m: x.max(1).values * 2.0,
    "F.pad": lambda x, w, m: m.F.pad(x, (1, 2, -1, 0)),
    "F.pad(value)": lambda x, w, m: m.F.pad(x, (0, 1, 2, 0, 1, 1), value=-0.5),
    "F.pad(reflect)": lambda x, w, m: m.F.pad(x, (2, 1), mode="reflect"),
    "F.pad(replicate)": lambda x, w, m: m.F.pad(x, (1, 2, 2, 1), mode="replicate"),
    "F.pad(circular)": lambda x, w, m: m.F.pad(x, (1, 3), mode="circular"),
    "qkv": lambda x, w, m: (lambda q, k, v: (q @ k.transpose(-2, -1)) @ v)(
        *(x @ w[..., :3].repeat(1, 4)).split(4, -1)),
}


EMBER = SimpleNamespace(cat=em.cat, stack=em.stack, tril=em.tril, triu=em.triu,
                        tensor=lambda a: a, F=nn.functional)


def torch_namespace(torch) -> SimpleNamespace:
    """The torch spellings of what the cases call as `m.<name>`."""
    return SimpleNamespace(cat=torch.cat, stack=torch.stack, tril=torch.tril,
                           triu=torch.triu, tensor=torch.tensor, F=torch.nn.functional)


def _w(dtype=np.float32):
    return W[:4].astype(dtype)


def weighted_grad(model, r: np.ndarray, backend: str):
    """The gradient of sum(model(w) * r) (r a constant: the loss's second argument is
    unused, so outputs of any first dim pass the batch check)."""
    return em.compile_grad(model, lambda out, _: (out * r).sum(), backend=backend)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_equal_torch(name, backend):
    torch = pytest.importorskip("torch")
    f = CASES[name]
    model, w = Fn(lambda x, w: f(x, w, EMBER)), _w()
    p = torch.tensor(X.astype(np.float32), requires_grad=True)
    want = f(p, torch.tensor(w), torch_namespace(torch))
    r = np.random.default_rng(2).standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.tensor(r)).sum().backward()
    got = em.compile(model, w, backend=backend)(w)
    grad = weighted_grad(model, r, backend)(w, w)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad[model.p], p.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_gradients_equal_finite_differences(name):
    """Torch-free: central differences of sum(f(x) * r) in float64 on the interpreter."""
    f = CASES[name]
    model, w = Fn(lambda x, w: f(x, w, EMBER), np.float64), _w(np.float64)
    run = em.compile(model, w, backend="interpreter")
    r = np.random.default_rng(2).standard_normal(run(w).shape)
    grad = weighted_grad(model, r, "interpreter")(w, w)
    num, eps = np.zeros_like(X), 1e-6
    for i in np.ndindex(X.shape):
        for sign in (1, -1):
            x = X.copy()
            x[i] += sign * eps
            model.p.data = x
            num[i] += sign * (run(w) * r).sum() / (2 * eps)
    np.testing.assert_allclose(grad[model.p], num, rtol=1e-6, atol=1e-8)


INTEGER_CASES = {  # name: (ember, numpy) on x of X's shape
    "argmax": (lambda x: x.argmax(-1), lambda x: x.argmax(-1)),
    "argmax(all)": (lambda x: x.argmax(), lambda x: np.asarray(x.argmax())),
    "argmin(0, keepdim)": (lambda x: x.argmin(0, keepdim=True), lambda x: x.argmin(0)[None]),
    "max(dim).indices": (lambda x: x.max(1).indices, lambda x: x.argmax(1)),
    "min(dim)[1]": (lambda x: x.min(dim=2)[1], lambda x: x.argmin(2)),
    "em.argmax": (lambda x: em.argmax(x, 1), lambda x: x.argmax(1)),
}


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("name", INTEGER_CASES)
def test_indices_equal_numpy(name, backend):
    ours, ref = INTEGER_CASES[name]
    x = np.round(X * 2) / 2  # ties: the first index wins, as in numpy and torch
    x = x.astype(np.float32)
    got = em.compile(Fn(lambda p, w: ours(w)), x, backend=backend)(x)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref(x))


def test_argmax_counts_nan_as_the_largest():
    x = np.array([[1.0, np.nan, 3.0], [2.0, 5.0, np.nan]], np.float32)
    got = em.compile(Fn(lambda p, w: w.argmax(1)), x, backend="cpu")(x)
    np.testing.assert_array_equal(got, [1, 2])


def test_a_traced_index_tensor_gathers_with_negative_indices():
    idx = np.array([-1, 0, 2], np.int64)
    model = Fn(lambda p, i: p[:, i] * 1.0)
    got = em.compile(model, idx, backend="cpu")(idx)
    np.testing.assert_allclose(got, X.astype(np.float32)[:, idx], rtol=1e-6)


def test_slicing_is_one_slice_op_and_its_gradient_one_unslice():
    g = em.trace(Fn(lambda p, w: p[:, 1:, ::2]), _w())
    assert [op.name for op in g.ops if op.name.startswith("ember.s")] == ["ember.slice"]


def trace_error(fn) -> str:
    with pytest.raises(em.ShapeError) as e:
        em.trace(Fn(lambda p, w: fn(p)), _w())
    return str(e.value)


@pytest.mark.parametrize("fn, message", [
    (lambda x: x[:, 3], r"index 3 is out of range for dim 1 of \[2, 3, 4\]"),
    (lambda x: x[-3], r"index -3 is out of range for dim 0 of \[2, 3, 4\]"),
    (lambda x: x[:, [0, 5]], r"index 5 is out of range for dim 1"),
    (lambda x: x[0, 0, 0, 0], "too many indices"),
    (lambda x: x[..., ::-1], "steps must be >= 1"),
    (lambda x: x[:, np.array([True, False])], r"boolean mask of shape \[2\] does not match"),
    (lambda x: x[x > 0], "depends on the data"),
    (lambda x: x[[0], [1]], "more than one integer array"),
    (lambda x: x.split([1, 1], 1), r"split: sizes \[1, 1\] add up to 2, not the 3 of dim 1"),
    (lambda x: em.cat([x, x[:, :, :2]], 1), r"ember.concat: shapes \[2, 3, 4\], \[2, 3, 2\] "
                                             "differ outside axis 1"),
    (lambda x: em.stack([x, x[:1]]), "stack needs equal shapes"),
])
def test_bad_indices_and_joins_name_the_op_the_shapes_and_the_line(fn, message):
    text = trace_error(fn)
    assert re.search(message, text), text
    assert "test_indexing.py" in text  # the user's source line
