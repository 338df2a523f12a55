"""Symbolic dimensions (runtime/dynamic.py): a padded, masked call equals an exact-shape
compile of the same model at every length, a handful of graphs serve every length, and
what cannot be padded exactly compiles exactly, with a notice."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from small_models import MeanPool

import ember as em
from ember import nn, optim

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpt import Gpt, lm_loss  # noqa: E402

LENGTHS = (1, 5, 8, 9, 31, 33, 64)


def gpt(block: int = 64) -> Gpt:
    em.seed(0)
    return Gpt(vocab=65, n_embd=32, n_head=2, n_layer=1, block=block)


def tokens(t: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + t).integers(0, 65, (2, t))


class FlatMax(nn.Module):
    """[B, T, C] flattened to [B, T * C], then a max and a sum over the flat axis."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        b, t, c = x.shape
        flat = self.fc(x).reshape(b, t * 4)
        return flat.max(axis=1) + flat.sum(axis=1) / 10.0, flat


class Bidirectional(nn.Module):
    """Attention that is not causal: the padded keys are masked."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiHeadAttention(6, 2, causal=False)

    def forward(self, x):
        return self.attn(x)


class NormOverT(nn.Module):
    """A layer norm over T: an op pad-mask refuses to mask."""

    def forward(self, x):
        return nn.functional.layer_norm(x.transpose(0, 2, 1), (x.shape[1],))


class AtMost40(nn.Module):
    """Refuses, while tracing, a sequence longer than 40."""

    def forward(self, x):
        if x.shape[1] > 40:
            raise ValueError("at most 40 positions")
        return x * 2.0


class HandMean(nn.Module):
    """A mean by hand: divides by x.shape[1], which padding would make the bucket."""

    def forward(self, x):
        return x.sum(axis=1) / x.shape[1]


class PositionSum(nn.Module):
    """Sums position embeddings over T: rows of a constant arange past the real length."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Embedding(64, 6)

    def forward(self, x):
        return x.mean(axis=1) + self.pos(np.arange(x.shape[1])).sum(axis=0)


def floats(t: int) -> np.ndarray:
    return np.random.default_rng(t).standard_normal((3, t, 6)).astype(np.float32)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_gpt_forward_equals_exact_shapes(backend):
    model = gpt()
    f = em.compile(model, em.TensorSpec((2, "T"), "i64"), backend=backend)
    lengths = LENGTHS if backend == "interpreter" else (1, 9, 33)
    for t in lengths:
        x = tokens(t)
        exact = em.compile(model, x, backend=backend)(x)
        np.testing.assert_allclose(f(x), exact, rtol=1e-5, atol=1e-6)
    assert f.compiles == len({max(8, 1 << (t - 1).bit_length()) for t in lengths})


@pytest.mark.parametrize("model_cls", [MeanPool, FlatMax, Bidirectional, PositionSum])
def test_mixing_models_equal_exact_shapes(model_cls):
    em.seed(1)
    model = model_cls()
    f = em.compile(model, floats(3), dynamic_dims={0: {1: "T"}}, backend="interpreter")
    for t in LENGTHS:
        x = floats(t)
        got, exact = f(x), em.compile(model, x, backend="interpreter")(x)
        for g, e in zip(*(o if isinstance(o, tuple) else (o,) for o in (got, exact))):
            assert g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    assert f.compiles == 4  # buckets 8, 16, 32, 64


def test_two_symbolic_dims():
    """Batch B and length T both symbolic: the result's rows are cut back to B."""
    em.seed(1)
    model = MeanPool()
    f = em.compile(model, em.TensorSpec(("B", "T", 6)), backend="interpreter")
    for b, t in ((3, 5), (2, 9), (5, 7)):
        x = np.random.default_rng(b * t).standard_normal((b, t, 6)).astype(np.float32)
        np.testing.assert_allclose(f(x), em.compile(model, x, backend="interpreter")(x),
                                   rtol=1e-5, atol=1e-6)
    assert f.compiles == 2  # (8, 8) and (8, 16)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_train_step_equals_exact_shapes(backend):
    """Losses and params after 3 steps of lengths 5, 9, 5 equal an exact-shape step's (SGD:
    Adam would blow up the rounding noise of gradients that are zero, as the key bias's)."""
    padded, exact = gpt(), gpt()
    dims = {0: {1: "T"}, 1: {1: "T"}}
    step = em.compile_train_step(padded, lm_loss, optim.SGD(lr=0.5, momentum=0.9),
                                 backend=backend, dynamic_dims=dims)
    ref = em.compile_train_step(exact, lm_loss, optim.SGD(lr=0.5, momentum=0.9),
                               backend=backend)
    for t in (5, 9, 5):
        x = tokens(t + 1, seed=7)
        xb, yb = x[:, :-1].copy(), x[:, 1:].copy()
        np.testing.assert_allclose(step(xb, yb), ref(xb, yb), rtol=1e-5)
    got, want = padded.state_dict(), exact.state_dict()
    for path in want:
        np.testing.assert_allclose(got[path], want[path], rtol=1e-5, atol=1e-6, err_msg=path)
    assert step.compiles == 2


def test_grad_equals_exact_shapes():
    em.seed(2)
    model = MeanPool()

    def loss(out, y):
        return nn.functional.cross_entropy(out, y)

    grad = em.compile_grad(model, loss, backend="interpreter", dynamic_dims={0: {1: "T"}})
    x, y = floats(11), np.array([0, 2, 1])
    got, want = grad(x, y), em.compile_grad(model, loss, backend="interpreter")(x, y)
    for pid, g in want.items():
        np.testing.assert_allclose(got[pid], g, rtol=1e-5, atol=1e-7)


def padded_grads_equal_exact(model, backend: str, x, y) -> None:
    """Cross-entropy gradients of `model` on (x, y) with axis 1 of x symbolic (padded to
    its bucket) equal an exact-shape compile's."""
    loss = nn.functional.cross_entropy
    padded = em.compile_grad(model, loss, backend=backend, dynamic_dims={0: {1: "T"}})
    got, want = padded(x, y), em.compile_grad(model, loss, backend=backend)(x, y)
    for pid, g in want.items():
        np.testing.assert_allclose(got[pid], g, rtol=1e-5, atol=1e-7)


class Normalized(nn.Module):
    """Normalizes each token's features: a padded (zero) token gives 0 * inf = NaN."""

    def __init__(self):
        super().__init__()
        self.proj, self.head = nn.Linear(6, 8, bias=False), nn.Linear(8, 3)

    def forward(self, x):
        h = self.proj(x)
        h = h * nn.functional.rsqrt((h * h).sum(axis=-1, keepdims=True))
        return self.head(nn.functional.relu(h).mean(axis=1))


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_padding_a_model_turns_into_nan_stays_out_of_the_gradients(backend):
    """The loss never saw the NaN at the padded tokens, but the backward multiplied it by
    their zero cotangent and summed it into proj's weight: NaN in every element."""
    em.seed(3)
    model = Normalized()
    padded_grads_equal_exact(model, backend, floats(11), np.array([0, 2, 1]))
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend=backend, dynamic_dims={0: {1: "T"}})
    for t in (11, 13, 9):
        assert np.isfinite(step(floats(t), np.array([0, 2, 1])))
    assert all(np.isfinite(p.val()).all() for p in model.parameters())


def test_lengths_1_to_100_compile_a_handful_of_graphs():
    f = em.compile(gpt(block=128), em.TensorSpec((1, "T"), "i64"), backend="interpreter")
    for t in range(1, 101):
        assert f(tokens(t)[:1]).shape == (1, t, 65)
    assert f.compiles <= 8
    assert f.compiles == 5  # 8, 16, 32, 64, 128


def test_inputs_that_disagree_name_both():
    step = em.compile_train_step(gpt(), lm_loss, optim.SGD(lr=0.1), backend="interpreter",
                                 dynamic_dims={0: {1: "T"}, 1: {1: "T"}})
    with pytest.raises(ValueError, match="inputs 0 and 1 disagree on symbolic dim T: 37 vs 36"):
        step(tokens(37), tokens(36))


def test_above_the_largest_bucket_compiles_exactly(capsys):
    em.seed(1)
    model = MeanPool()
    f = em.compile(model, em.TensorSpec((3, "T", 6)), buckets=(8, 16), backend="interpreter")
    x = floats(20)
    np.testing.assert_allclose(f(x), em.compile(model, x, backend="interpreter")(x),
                               rtol=1e-5, atol=1e-6)
    assert "T=20 is above the largest bucket 16: compiling for that exact size" \
        in capsys.readouterr().err
    f(x)
    assert "above the largest bucket" not in capsys.readouterr().err  # once per size
    assert f(floats(9)).shape == (3, 3) and f.compiles == 2


def test_an_op_that_cannot_be_masked_compiles_exactly(capsys):
    model = NormOverT()
    f = em.compile(model, em.TensorSpec((3, "T", 6)), backend="interpreter")
    x = floats(5)
    np.testing.assert_allclose(f(x), em.compile(model, x, backend="interpreter")(x),
                               rtol=1e-5, atol=1e-6)
    err = capsys.readouterr().err
    assert "compiling each length of bucket T=8 exactly: pad-mask: cannot mask " \
        "nn.layer_norm at" in err and "test_dynamic_dims.py" in err
    assert "it normalizes over a padded axis" in err
    assert f(floats(7)).shape == (3, 6, 7) and f.compiles == 2  # exact in that bucket
    assert "cannot mask" not in capsys.readouterr().err


def test_a_bucket_past_the_position_table_compiles_exactly(capsys):
    """Padding 40 tokens to 64 would gather positions past a 48-row table."""
    model = gpt(block=48)
    f = em.compile(model, em.TensorSpec((2, "T"), "i64"), backend="interpreter")
    x = tokens(40)
    np.testing.assert_allclose(f(x), em.compile(model, x, backend="interpreter")(x),
                               rtol=1e-5, atol=1e-6)
    assert "reach past the 48 rows of the table" in capsys.readouterr().err
    assert f(tokens(20)).shape == (2, 20, 65) and f.compiles == 2  # bucket 32 is padded


def test_a_value_from_a_padded_size_compiles_exactly(capsys):
    model = HandMean()
    f = em.compile(model, em.TensorSpec((3, "T", 6)), backend="interpreter")
    x = floats(5)
    np.testing.assert_allclose(f(x), em.compile(model, x, backend="interpreter")(x),
                               rtol=1e-6)
    err = capsys.readouterr().err
    assert "cannot mask ember.constant at" in err and "test_dynamic_dims.py" in err
    assert "its value follows the size of a symbolic dimension" in err


def test_a_bucket_the_model_does_not_trace_at_compiles_exactly(capsys):
    f = em.compile(AtMost40(), em.TensorSpec((3, "T", 6)), backend="interpreter")
    x = floats(33)  # bucket 64 does not trace; 33 does
    np.testing.assert_allclose(f(x), 2 * x)
    assert "does not trace at T=64 and 63 and 33: ValueError: at most 40" in \
        capsys.readouterr().err
    with pytest.raises(ValueError, match="at most 40 positions"):
        f(floats(41))  # nor does 41 itself: the user's error, as without symbolic dims


class Branchy(nn.Module):
    """Takes another path for sequences over 12 long."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        y = self.fc(x)
        return y * 2.0 if x.shape[1] > 12 else y


def test_a_model_that_branches_on_a_size_inside_a_bucket_compiles_exactly(capsys):
    """Bucket 16 holds 9 to 16: traced at 16 and 15 only, length 10 ran the long branch."""
    model = Branchy()
    f = em.compile(model, em.TensorSpec((3, "T", 6)), backend="interpreter")
    for t in (10, 13, 16):
        x = floats(t)
        np.testing.assert_allclose(f(x), em.compile(model, x, backend="interpreter")(x),
                                   rtol=1e-6)
    assert "the traced ops change with the size of a symbolic dimension" in \
        capsys.readouterr().err


class Normed(nn.Module):
    """BatchNorm over [B, C, T]: training's batch statistics cannot be masked, eval's can."""

    def __init__(self):
        super().__init__()
        self.bn, self.fc = nn.BatchNorm1d(4), nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(self.bn(x).mean(axis=2))


def test_a_bucket_refused_in_one_model_state_is_padded_in_another(capsys):
    """Refused in training, the bucket stayed refused after model.eval(): every length
    compiled exactly."""
    model = Normed()
    grad = em.compile_grad(model, nn.functional.cross_entropy, backend="interpreter",
                           dynamic_dims={0: {2: "T"}})
    y = np.array([0, 1])
    grad(np.ones((2, 4, 10), np.float32), y)
    assert "batch statistics over a padded axis" in capsys.readouterr().err
    model.eval()
    for t in (11, 12, 13):
        grad(np.ones((2, 4, t), np.float32), y)
    assert grad.compiles == 2  # length 10 exactly, then bucket 16 for the rest


class Shifted(nn.Module):
    """Embeds idx - 1: the zero padding becomes -1, no row of the table."""

    def __init__(self):
        super().__init__()
        self.emb, self.fc = nn.Embedding(20, 8), nn.Linear(8, 3)

    def forward(self, idx):
        return self.fc(self.emb(idx - 1).mean(axis=1))


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_index_arithmetic_on_padding_stays_inside_the_table(backend):
    """The padded positions of a gather's indices read row 0 (they raised IndexError)."""
    model = Shifted()
    f = em.compile(model, em.TensorSpec((2, "T"), "i64"), backend=backend)
    idx = np.random.default_rng(0).integers(1, 20, (2, 11))
    np.testing.assert_allclose(f(idx), em.compile(model, idx, backend=backend)(idx),
                               rtol=1e-6)
    assert f.compiles == 1


class Dropped(nn.Module):
    """Dropout over [B, T, C], then a mean over T."""

    def __init__(self):
        super().__init__()
        self.fc, self.drop, self.head = nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.drop(self.fc(x)).mean(axis=1))


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_dropout_under_padding_draws_the_exact_compiles_mask(backend):
    """The mask hashes each element's coordinates, not its flat index in the padded shape
    (the second row of a padded batch drew another row's mask)."""
    model = Dropped()
    padded_grads_equal_exact(model, backend, floats(11), np.array([0, 2, 1]))


def test_bad_specs():
    with pytest.raises(ValueError, match="buckets must be increasing"):
        em.compile(MeanPool(), em.TensorSpec((3, "T", 6)), buckets=(16, 8))
    with pytest.raises(ValueError, match="symbolic dimensions T have no size"):
        em.trace(MeanPool(), em.TensorSpec((3, "T", 6)))
