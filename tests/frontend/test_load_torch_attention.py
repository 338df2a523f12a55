"""load_torch and attention: torch.nn.MultiheadAttention's stacked in_proj split into ember's
query/key/value projections, and key_map results that name several keys (a split)."""

import numpy as np
import pytest

import ember as em
from ember import nn
from ember.frontend.records import RecordError, load_torch

torch = pytest.importorskip("torch")

E, HEADS = 16, 4
R = np.random.default_rng(0)


def randn(*shape):
    return R.normal(size=shape).astype(np.float32)


def run(model, *inputs):
    return em.compile(model, *inputs, backend="interpreter")(*inputs)


def torch_mha(bias=True):
    torch.manual_seed(0)
    return torch.nn.MultiheadAttention(E, HEADS, bias=bias, batch_first=True).eval()


@pytest.mark.parametrize("bias", [True, False])
def test_same_outputs_as_torch_multihead_attention(bias):
    tm = torch_mha(bias)
    model = nn.MultiHeadAttention(E, HEADS, bias=bias)
    report = load_torch(model, tm.state_dict())
    names = ["query.weight", "key.weight", "value.weight", "output.weight"]
    if bias:
        names += ["query.bias", "key.bias", "value.bias", "output.bias"]
    assert sorted(report.loaded) == sorted(names)
    w = tm.in_proj_weight.detach().numpy()
    np.testing.assert_array_equal(model.key.weight.val(), w[E:2 * E].T)
    x = randn(2, 5, E)
    tx = torch.from_numpy(x)
    np.testing.assert_allclose(run(model, x), tm(tx, tx, tx, need_weights=False)[0].detach(),
                               atol=1e-5)


def test_cross_and_causal_attention_match_torch():
    tm = torch_mha()
    q, k, v = randn(2, 3, E), randn(2, 6, E), randn(2, 6, E)
    cross = nn.MultiHeadAttention(E, HEADS)
    load_torch(cross, tm.state_dict())
    want = tm(*map(torch.from_numpy, (q, k, v)), need_weights=False)[0].detach()
    np.testing.assert_allclose(run(cross, q, k, v), want, atol=1e-5)

    causal = nn.MultiHeadAttention(E, HEADS, causal=True)
    load_torch(causal, tm.state_dict())
    x = randn(2, 5, E)
    tx = torch.from_numpy(x)
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)  # torch's True: masked out
    want = tm(tx, tx, tx, attn_mask=mask, need_weights=False)[0].detach()
    np.testing.assert_allclose(run(causal, x), want, atol=1e-5)


class Blocks(nn.Module):
    """Attention at depth: a field, and in a ModuleList (as torch's encoder layers)."""

    def __init__(self):
        super().__init__()
        self.self_attn = nn.MultiHeadAttention(E, HEADS)
        self.layers = nn.ModuleList([nn.MultiHeadAttention(E, HEADS) for _ in range(2)])

    def forward(self, x):
        x = x + self.self_attn(x)
        for layer in self.layers:
            x = x + layer(x)
        return x


class TorchBlocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = torch.nn.MultiheadAttention(E, HEADS, batch_first=True)
        self.layers = torch.nn.ModuleList([torch.nn.MultiheadAttention(E, HEADS,
                                                                       batch_first=True)
                                           for _ in range(2)])

    def forward(self, x):
        x = x + self.self_attn(x, x, x, need_weights=False)[0]
        for layer in self.layers:
            x = x + layer(x, x, x, need_weights=False)[0]
        return x


def test_nested_attention_keys_map_to_their_paths():
    torch.manual_seed(1)
    tm = TorchBlocks().eval()
    model = Blocks()
    report = load_torch(model, tm.state_dict())
    assert "layers.1.value.bias" in report.loaded and "self_attn.output.weight" in report.loaded
    x = randn(2, 4, E)
    np.testing.assert_allclose(run(model, x), tm(torch.from_numpy(x)).detach(), atol=1e-5)


class SplitAttention(nn.Module):
    """Separate q/k/v Linears, as an ember port of a model with a fused qkv Linear."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(E, E) for _ in range(3))


def fused_qkv():
    """nanoGPT's c_attn: one Linear(E, 3E), q, k and v stacked along dim 0 of its weight."""
    torch.manual_seed(2)
    return {"attn.c_attn." + k: v for k, v in torch.nn.Linear(E, 3 * E).state_dict().items()}


@pytest.mark.parametrize("key_map", [
    {"attn.c_attn.": ["q.", "k.", "v."]},
    lambda key: [key.replace("attn.c_attn", name) for name in "qkv"],
], ids=["prefixes", "callable"])
def test_key_map_may_split_a_tensor_evenly_along_dim_0(key_map):
    state = fused_qkv()
    model = SplitAttention()
    report = load_torch(model, state, key_map=key_map)
    assert sorted(report.loaded) == ["k.bias", "k.weight", "q.bias", "q.weight", "v.bias",
                                     "v.weight"]
    w, b = (state[f"attn.c_attn.{n}"].detach().numpy() for n in ("weight", "bias"))
    for i, m in enumerate((model.q, model.k, model.v)):  # in PyTorch's layout: transposed
        np.testing.assert_array_equal(m.weight.val(), w[i * E:(i + 1) * E].T)
        np.testing.assert_array_equal(m.bias.val(), b[i * E:(i + 1) * E])


def test_a_key_map_split_into_an_attentions_pytorch_keys():
    """A renamed key may be PyTorch-style: a fused qkv weight named in_proj_weight."""
    state = fused_qkv()
    model = nn.MultiHeadAttention(E, HEADS)
    key_map = {"attn.c_attn.weight": "in_proj_weight", "attn.c_attn.bias": "in_proj_bias"}
    load_torch(model, state, key_map=key_map, strict=False)
    np.testing.assert_array_equal(model.value.weight.val(),
                                  state["attn.c_attn.weight"].detach().numpy()[2 * E:].T)


def _values(model):
    return {k: v.copy() for k, v in model.state_dict().items()}


def test_bad_splits_are_record_errors_that_change_nothing():
    model = nn.MultiHeadAttention(E, HEADS)
    before = _values(model)
    state = dict(torch_mha().state_dict())
    state["in_proj_weight"] = torch.zeros(3 * E + 1, E)
    state["in_proj_bias"] = torch.zeros(3 * (E + 1))
    with pytest.raises(RecordError) as e:
        load_torch(model, state)
    msg = str(e.value)
    assert f"at in_proj_weight: [{3 * E + 1}, {E}] does not split evenly along dim 0 into 3" \
        in msg
    assert (f"mismatch at query.bias: PyTorch has [{E + 1}] (a part of in_proj_bias), the "
            f"model has [{E}]") in msg
    assert "missing: query.weight, key.weight, value.weight" in msg
    with pytest.raises(RecordError, match="q.weight is given twice, by a.weight and b.weight"):
        load_torch(SplitAttention(), {"a.weight": torch.zeros(E, E),
                                      "b.weight": torch.zeros(2 * E, E)},
                   key_map=lambda k: "q.weight" if k == "a.weight" else ["q.weight", "k.weight"],
                   strict=False)
    with pytest.raises(TypeError, match="key_map gave 3 for 'in_proj_weight'"):
        load_torch(model, state, key_map=lambda k: 3)
    assert all(np.array_equal(v, _values(model)[k]) for k, v in before.items())
