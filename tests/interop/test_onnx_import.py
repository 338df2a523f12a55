"""Models defined in PyTorch, exported with torch.onnx.export (the TorchScript exporter,
`dynamo=False`, which needs no onnxscript), imported with `em.onnx.load`: outputs match
PyTorch's, and fine-tuning the imported CNN matches fine-tuning the original."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

from torch_onnx import torch_export  # noqa: E402

import ember as em  # noqa: E402


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.fc(torch.flatten(x, 1))


class Block(torch.nn.Module):
    """Pre-norm transformer block; attention written out with matmul/softmax/reshape."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def export(model: torch.nn.Module, x: np.ndarray, opset: int = 17) -> bytes:
    """Without constant folding, which would fuse BatchNorm into the conv (a different
    model to fine-tune)."""
    return torch_export(model, x, opset, fold=False)


def _cnn(seed=0):
    torch.manual_seed(seed)
    model = Cnn()
    with torch.no_grad():  # running statistics that are not the defaults
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_cnn_matches_pytorch(backend):
    x = np.random.default_rng(0).standard_normal((8, 1, 8, 8)).astype(np.float32)
    model = _cnn()
    m = em.onnx.load(export(model, x))
    assert sorted(m.state_dict()) == sorted(f"initializers.{n}" for n in m.initializers)
    got = em.compile(m, x, backend=backend)(x)
    np.testing.assert_allclose(got, model(torch.from_numpy(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_transformer_block_matches_pytorch(backend):
    torch.manual_seed(1)
    x = np.random.default_rng(1).standard_normal((2, 5, 16)).astype(np.float32)
    model = Block().eval()
    m = em.onnx.load(export(model, x))
    # only weights became Params: shape arithmetic (Shape -> Gather -> Concat) was folded
    assert all(p.val().dtype == np.float32 for p in m.initializers.values())
    got = em.compile(m, x, backend=backend)(x)
    np.testing.assert_allclose(got, model(torch.from_numpy(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-5)


class Activations(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x):
        h = 4 * self.fc(x)  # some past Softplus's threshold (20 in PyTorch; none in ONNX)
        return (torch.nn.functional.softplus(h) + torch.sigmoid(h) * torch.tanh(h)
                - torch.nn.functional.silu(h) + torch.nn.functional.leaky_relu(h, 0.1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activations_match_pytorch(dtype):
    torch.manual_seed(2)
    x = 3 * np.random.default_rng(3).standard_normal((16, 6)).astype(dtype)
    model = Activations().to(torch.float64 if dtype == np.float64 else torch.float32).eval()
    got = em.compile(em.onnx.load(export(model, x)), x)(x)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    tol = 1e-5 if dtype == np.float32 else 1e-8  # PyTorch's threshold moves f64 by 2e-9
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_fine_tuning_the_imported_cnn_matches_pytorch():
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((20, 8, 1, 8, 8)).astype(np.float32)
    ys = rng.integers(0, 10, (20, 8))
    model = _cnn(3)
    m = em.onnx.load(export(model, xs[0]))
    step = em.compile_train_step(m, em.nn.functional.cross_entropy, em.optim.SGD(lr=0.1),
                                 backend="cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in zip(xs, ys):
        loss = step(x, y)
        opt.zero_grad()
        want = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        want.backward()
        opt.step()
        assert loss == pytest.approx(want.item(), rel=1e-4, abs=1e-4)
    trained = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert sorted(m.initializers) == sorted(k for k in trained if "num_batches" not in k)
    for name, p in m.initializers.items():
        np.testing.assert_allclose(p.val(), trained[name], rtol=1e-4, atol=1e-4)
    assert not m.initializers["bn.running_mean"].requires_grad  # a buffer, as in PyTorch


class Windows(torch.nn.Module):
    """Split, Concat, Slice (positive steps, and flip's negative one) and constant Pads."""

    def forward(self, x):
        a, b = x.split([2, 4], dim=1)
        y = torch.cat([b, a], dim=1)[:, 1:5, ::2]
        pad = torch.nn.functional.pad
        y = pad(y, (1, 2, 0, 1)) + pad(y, (2, 1, 1, 0), value=0.5)
        return y * torch.flip(y, [2])


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_windows_copy_what_they_read(backend):
    """Each window is ember's slice, unslice or concat, with no index array; only the
    negative step (flip) gathers."""
    x = np.random.default_rng(4).standard_normal((2, 6, 8)).astype(np.float32)
    m = em.onnx.load(export(Windows().eval(), x))
    ops = [op.name for op in em.trace(m, em.TensorSpec.of(x)).ops]
    assert {"ember.slice", "ember.concat", "ember.unslice"} <= set(ops)
    assert ops.count("ember.gather") == 1 and "ember.scatter_add" not in ops
    np.testing.assert_allclose(em.compile(m, x, backend=backend)(x),
                               Windows()(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=1e-6)
