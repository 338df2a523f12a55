"""`nn.functional.hardswish` and `hardsigmoid` (compositions of existing ops) and `sign`
(the primitive `ember.sign`) against PyTorch: values and gradients on the interpreter and
the cpu backend, in f32 and f64, at the kinks x = -3 and x = 3 and around them. (The
primitive's per-op and fused kernels on every backend are tested with all elementwise
ops, from the registry.)"""

import numpy as np
import pytest
from small_models import Fn

import ember as em
from ember import nn

torch = pytest.importorskip("torch")
F = nn.functional

EDGES = [-1e4, -10, -3.5, -3.0001, -3, -2.9999, -2.5, -1, -1e-3, 0, 1e-3, 1, 2.5, 2.9999, 3,
         3.0001, 3.5, 10, 1e4]
X = np.concatenate([EDGES, np.random.default_rng(0).normal(size=45) * 4])
W = np.random.default_rng(1).normal(size=X.shape)
TOL = {"f32": dict(rtol=1e-6, atol=1e-7), "f64": dict(rtol=1e-15, atol=1e-15)}
TORCH = {"hardswish": torch.nn.functional.hardswish,
         "hardsigmoid": torch.nn.functional.hardsigmoid, "sign": torch.sign}
# the derivatives as torch defines them, exactly (torch's f64 hardsigmoid backward uses
# 1/6 rounded to f32, off by 3e-8)
DERIVATIVE = {
    "hardswish": lambda x: np.where(x <= -3, 0, np.where(x >= 3, 1, x / 3 + 0.5)),
    "hardsigmoid": lambda x: np.where((-3 < x) & (x < 3), 1 / 6, 0),
    "sign": np.zeros_like,
}


class Act(nn.Module):
    """fn(p) * r, so that d sum(out * w) / dp = fn'(p) * r * w."""

    def __init__(self, fn, x):
        super().__init__()
        self.fn, self.p = fn, em.Param.from_array(x)

    def forward(self, r):
        return self.fn(self.p) * r


@pytest.mark.parametrize("name", list(TORCH))
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_values_and_gradients_against_torch(backend, dtype, name):
    x, w = X.astype(dtype.replace("f", "float")), W.astype(dtype.replace("f", "float"))
    model, ones = Act(getattr(F, name), x), np.ones_like(x)
    p = torch.tensor(x, requires_grad=True)
    want = TORCH[name](p)
    (want * torch.tensor(w)).sum().backward()
    got = em.compile(model, ones, backend=backend)(ones)
    grad = em.compile_grad(model, lambda out, y: (out * y).sum(), backend=backend)(ones, w)
    np.testing.assert_allclose(got, want.detach().numpy(), **TOL[dtype])
    exact = DERIVATIVE[name](x) * w if dtype == "f64" else p.grad.numpy()
    np.testing.assert_allclose(grad[model.p], exact, **TOL[dtype])


@pytest.mark.parametrize("name", ["hardswish", "hardsigmoid"])
def test_the_gradient_at_the_kinks_is_torchs(name):
    """0 at x = -3 for both; at x = 3, 1 for hardswish and 0 for hardsigmoid: torch's
    backward takes the open interval (-3, 3) as the sloped part."""
    model = Act(getattr(F, name), np.array([-3.0, 3.0]))
    grad = em.compile_grad(model, lambda out, y: out.sum(), backend="cpu")(np.ones(2), 0)
    np.testing.assert_array_equal(grad[model.p], [0, 1] if name == "hardswish" else [0, 0])


def test_layers_call_their_functional_twins():
    x = X.reshape(8, 8).astype(np.float32)
    for layer, fn in [(nn.Hardswish(), torch.nn.Hardswish()),
                      (nn.Hardsigmoid(), torch.nn.Hardsigmoid())]:
        np.testing.assert_allclose(em.compile(layer, x)(x), fn(torch.tensor(x)).numpy(),
                                   **TOL["f32"])


def test_hardswish_never_overflows():
    """x * hardsigmoid(x), not x * relu6(x + 3) / 6: torch's x * 6 is inf past 5.7e37."""
    x = np.array([1e38, 3e38, -1e38], np.float32)
    np.testing.assert_array_equal(em.compile(nn.Hardswish(), x)(x), x * [1, 1, 0])


def test_the_hard_activations_are_compositions_and_sign_one_primitive():
    x = np.zeros(3, np.float32)
    made = {name: {op.name for op in em.trace(Fn(getattr(F, name)), x).ops} for name in TORCH}
    core = {"ember.constant", "ember.add", "ember.mul", "ember.div", "ember.max", "ember.min",
            "func.return"}
    assert made["hardswish"] <= core and made["hardsigmoid"] <= core
    for fn in (F.sign, lambda t: t.sign()):  # nn.functional's and the Tensor method
        assert [op.name for op in em.trace(Fn(fn), x).ops] == ["ember.sign", "func.return"]


@pytest.mark.parametrize("dtype", ["i32", "i64", "f32"])
def test_sign_of_integers_and_specials(dtype):
    """Integers keep their dtype; -0.0 gives 0, and NaN stays NaN, as numpy and onnxruntime
    (torch.sign gives 0 for NaN)."""
    x = (np.array([-7, 0, 5, -1, 1]) if dtype != "f32" else
         np.array([-np.inf, -0.0, 0.0, np.nan, np.inf, -1e-45]))
    x = x.astype({"i32": np.int32, "i64": np.int64, "f32": np.float32}[dtype])
    for backend in ("interpreter", "cpu"):
        got = em.compile(Fn(F.sign), x, backend=backend)(x)
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, np.sign(x))
        assert not np.signbit(got[x == 0]).any()
