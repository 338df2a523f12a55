"""Tensor and functional ops with torch's semantics: 1-D matmul operands, dim 0/-1 of 0-d
tensors, attention with attn_mask and broadcast batch dims, div's rounding_mode and
add/sub's alpha: values and gradients against torch."""

import numpy as np
import pytest
from torch_semantics import check

import ember as em
from ember import nn

F = nn.functional
torch = pytest.importorskip("torch")
TF = torch.nn.functional
BACKENDS = ["interpreter", "cpu"]


def _randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


MATMUL = {  # name: (left shape, right shape)
    "vector @ matrix": ((3,), (3, 4)),
    "matrix @ vector": ((2, 3), (3,)),
    "vector @ vector": ((3,), (3,)),
    "vector @ batch": ((3,), (2, 3, 4)),
    "batch @ vector": ((2, 5, 3), (3,)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", MATMUL)
def test_1d_matmul_operands_match_torch(name, backend):
    a, b = (_randn(*s, seed=i) for i, s in enumerate(MATMUL[name]))
    check(lambda a, b: a @ b, torch.matmul, a, b, backend=backend)


def test_1d_matmul_with_an_array_operand():
    w = _randn(3, 4)
    check(lambda a: a @ w, lambda a: a @ torch.tensor(w), _randn(3), backend="cpu")
    check(lambda a: w.T @ a, lambda a: torch.tensor(w.T) @ a, _randn(3), backend="cpu")


SCALAR = {  # name: (ember, torch) of a 0-d tensor
    "sum 0": (lambda x: x.sum(0), lambda x: x.sum(0)),
    "mean -1": (lambda x: x.mean(-1), lambda x: x.mean(-1)),
    "max 0 keepdims": (lambda x: x.max(0, keepdims=True), lambda x: x.amax(0, keepdim=True)),
    "sum (0,)": (lambda x: x.sum((0,)), lambda x: x.sum((0,))),
    "softmax 0": (lambda x: F.softmax(x, 0), lambda x: TF.softmax(x, 0)),
    "log_softmax -1": (lambda x: F.log_softmax(x * 3.0, -1), lambda x: TF.log_softmax(x * 3, -1)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", SCALAR)
def test_dim_0_of_a_0d_tensor_is_allowed(name, backend):
    ours, theirs = SCALAR[name]
    check(ours, theirs, np.array(1.5, np.float32), backend=backend)


Q, K, V = _randn(2, 3, 5, 4, seed=1), _randn(2, 3, 6, 4, seed=2), _randn(2, 3, 6, 4, seed=3)
BOOL = np.random.default_rng(4).random((5, 6)) > 0.3
BOOL[:, 0] = True  # every query attends to something
ATTENTION = {  # name: (q, k, v, keyword arguments of both)
    "bool mask": (Q, K, V, dict(attn_mask=BOOL)),
    "bool mask per batch": (Q, K, V, dict(attn_mask=np.broadcast_to(BOOL, (2, 1, 5, 6)).copy())),
    "float mask": (Q, K, V, dict(attn_mask=_randn(3, 5, 6, seed=5))),
    "3-d queries": (Q[0], K, V, {}),
    "3-d queries masked scaled": (Q[0, :1], K[:, 0], V[:, 0], dict(attn_mask=BOOL, scale=0.3)),
    "2-d keys causal": (Q, K[0, 0], V[0, 0], dict(is_causal=True)),
}


def _ours(kw: dict) -> dict:
    """torch's SDPA keywords in ember's spelling (is_causal -> causal)."""
    return {("causal" if k == "is_causal" else k): v for k, v in kw.items()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ATTENTION)
def test_attention_masks_and_broadcast_batches_match_torch(name, backend):
    q, k, v, kw = ATTENTION[name]
    mask = kw.get("attn_mask")
    theirs_kw = dict(kw, attn_mask=torch.tensor(mask)) if mask is not None else kw
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **_ours(kw)),
          lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, **theirs_kw), q, k, v,
          backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_multi_head_attention_takes_a_mask(backend):
    em.seed(0)
    mha = nn.MultiHeadAttention(8, 2)
    x = _randn(2, 5, 8)
    mask = np.tril(np.ones((5, 5), bool)) & (np.random.default_rng(0).random((5, 5)) > 0.2)
    np.fill_diagonal(mask, True)
    got = em.compile(_Masked(mha, mask), x, backend=backend)(x)
    w = [torch.tensor(m.weight.val()) for m in (mha.query, mha.key, mha.value, mha.output)]
    b = [torch.tensor(m.bias.val()) for m in (mha.query, mha.key, mha.value, mha.output)]
    xt = torch.tensor(x)
    q, k, v = ((xt @ wi + bi).reshape(2, 5, 2, 4).transpose(1, 2)
               for wi, bi in zip(w[:3], b[:3]))
    y = TF.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(mask))
    want = y.transpose(1, 2).reshape(2, 5, 8) @ w[3] + b[3]
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)


class _Masked(nn.Module):
    def __init__(self, mha, mask):
        super().__init__()
        self.mha, self.mask = mha, mask

    def forward(self, x):
        return self.mha(x, attn_mask=self.mask)


A = np.array([[7.0, -7.0, 5.5, -5.5], [0.25, -3.0, 1e30, -1e30]], np.float32)
B = np.array([[2.0, 2.0, -2.0, -2.0], [0.5, 3.0, 3.0, 7.0]], np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_div_rounding_mode_matches_torch(mode, backend):
    check(lambda a, b: F.div(a, b, rounding_mode=mode),
          lambda a, b: torch.div(a, b, rounding_mode=mode), A, B, backend=backend, grad=False)
    ints = (A[:, :2] * 3).astype(np.int64), B[:, :2].astype(np.int64) + 1
    check(lambda a, b: F.div(a, b, rounding_mode=mode),
          lambda a, b: torch.div(a, b, rounding_mode=mode), *ints, backend=backend)


def test_div_rounding_mode_has_no_gradient():
    """torch's gradient of a rounded quotient is zero; ember's gradient is of its sum with
    a plain product, so only that product's part remains."""
    check(lambda a, b: F.div(a, b, rounding_mode="floor") + a * b,
          lambda a, b: torch.div(a, b, rounding_mode="floor") + a * b, A[:, :2], B[:, :2],
          backend="cpu")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["add", "sub"])
def test_add_and_sub_take_alpha(op, backend):
    ours, theirs = getattr(F, op), getattr(torch, op)
    check(lambda a, b: ours(a, b, alpha=2.5), lambda a, b: theirs(a, b, alpha=2.5),
          _randn(2, 3), _randn(3, seed=1), backend=backend)
    check(lambda a: ours(a, 2.0, alpha=-3), lambda a: theirs(a, 2.0, alpha=-3), _randn(2, 3),
          backend=backend)


def test_bad_arguments_name_themselves():
    with pytest.raises(em.ShapeError, match=r"matmul: shapes \[3\] and \[4, 2\] do not multiply"):
        check(lambda a, b: a @ b, None, _randn(3), _randn(4, 2), backend="interpreter")
    with pytest.raises(em.ShapeError, match=r"axis 1 is out of range for a 0-d tensor"):
        check(lambda x: x.sum(1), None, np.array(1.0, np.float32), backend="interpreter")
    with pytest.raises(em.ShapeError, match=r"attn_mask \[4, 6\] does not broadcast to the "
                                            r"scores \[..., Tq, Tk\] \[2, 3, 5, 6\]"):
        check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=BOOL[:4]),
              None, Q, K, V, backend="interpreter")
    with pytest.raises(em.ShapeError, match=r"q \[2, 3, 5, 4\], k \[4, 6, 4\] and v \[4, 6, 4\]"
                                            r" must be \[..., T, d\] with leading dims that "
                                            "broadcast"):
        check(F.scaled_dot_product_attention, None, Q, K[0, :1].repeat(4, 0), V[0, :1].repeat(
            4, 0), backend="interpreter")
    with pytest.raises(ValueError, match="rounding_mode must be None, 'trunc' or 'floor'"):
        check(lambda a, b: F.div(a, b, rounding_mode="round"), None, A, B,
              backend="interpreter")
