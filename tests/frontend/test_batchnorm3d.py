"""BatchNorm3d (and the options BatchNorm1d/2d share with it) as torch's: training and eval,
running statistics and momentum, affine=False, track_running_stats=False; a wrong rank
named with the module path and the shape; and a small 3-d CNN (Conv3d, BatchNorm3d, ReLU,
MaxPool3d, AdaptiveAvgPool3d, Linear) written as PyTorch code trains as the same torch
model does from the same weights."""

import numpy as np
import pytest

import ember as em
from ember import nn

torch = pytest.importorskip("torch")


def _x(*shape):
    return (2 * np.random.default_rng(0).standard_normal(shape) + 1).astype(np.float32)


class ConvNorm(nn.Module):
    """A 1x1x1 Conv3d (something to train) and the norm under test."""

    def __init__(self, conv, bn):
        super().__init__()
        self.conv, self.bn = conv, bn

    def forward(self, x):
        return self.bn(self.conv(x))


def _twins(**kw):
    """ember's ConvNorm and torch's, with the same weights."""
    em.seed(0)
    ours = ConvNorm(nn.Conv3d(2, 3, 1), nn.BatchNorm3d(3, momentum=0.3, **kw))
    theirs = torch.nn.Sequential(torch.nn.Conv3d(2, 3, 1),
                                 torch.nn.BatchNorm3d(3, momentum=0.3, **kw))
    state = {"0.weight": ours.conv.weight.val(), "0.bias": ours.conv.bias.val()}
    if ours.bn.gamma is not None:
        ours.bn.gamma.set_value(np.array([0.5, 1.5, -1.0], np.float32))
        ours.bn.beta.set_value(np.array([0.1, -0.2, 0.3], np.float32))
        state.update({"1.weight": ours.bn.gamma.val(), "1.bias": ours.bn.beta.val()})
    theirs.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)
    return ours, theirs


@pytest.mark.parametrize("kw", [{}, dict(affine=False), dict(track_running_stats=False)],
                         ids=["default", "affine=False", "track_running_stats=False"])
def test_training_steps_and_eval_match_torch(kw):
    """Two SGD steps (batch statistics, running ones updated by momentum), then eval
    (running statistics; without them, batch statistics again), on the cpu backend."""
    ours, theirs = _twins(**kw)
    step = em.compile_train_step(ours, lambda out, w: (out * w).sum(), em.optim.SGD(lr=0.1),
                                 backend="cpu")
    opt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    for seed in (1, 2):
        x = _x(2, 2, 3, 4, 2) * seed
        w = np.random.default_rng(seed).standard_normal((2, 3, 3, 4, 2)).astype(np.float32)
        opt.zero_grad()
        loss = (theirs.train()(torch.tensor(x)) * torch.tensor(w)).sum()
        loss.backward()
        opt.step()
        np.testing.assert_allclose(step(x, w), loss.item(), rtol=1e-5, atol=1e-4)
    bn = ours.bn
    if bn.running_mean is not None:
        np.testing.assert_allclose(bn.running_mean.val(), theirs[1].running_mean, rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(bn.running_var.val(), theirs[1].running_var, rtol=1e-5,
                                   atol=1e-6)
    x = _x(2, 2, 2, 3, 4)
    got = em.compile(ours.valid(), x, backend="cpu")(x)
    np.testing.assert_allclose(got, theirs.eval()(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)


def test_the_options_change_params_buffers_and_repr():
    assert repr(nn.BatchNorm3d(4)) == ("BatchNorm3d(num_features=4, eps=1e-05, momentum=0.1)"
                                       "  # 8 params, 8 buffers")
    bare = nn.BatchNorm3d(4, 1e-3, 0.2, False, False)
    assert bare.num_params() == 0 and bare.num_buffers() == 0
    assert "affine=False, track_running_stats=False" in repr(bare)
    assert nn.BatchNorm1d(3, affine=False).num_buffers() == 6
    with pytest.raises(ValueError, match=r"BatchNorm3d momentum=None \(torch's cumulative "
                                         "average\\) is not supported"):
        nn.BatchNorm3d(3, momentum=None)


def test_a_wrong_rank_names_the_module_path_and_the_shape():
    model = nn.Sequential(nn.Conv3d(2, 3, 1), nn.Sequential(nn.BatchNorm3d(3)))
    with pytest.raises(em.ShapeError, match=r"^layers.1.layers.0 \(BatchNorm3d\): BatchNorm3d "
                                            r"input must be \(N, C, D, H, W\), got "
                                            r"\[3, 4, 4, 4\]"):
        em.trace(model, em.TensorSpec((2, 4, 4, 4), "f32"))  # conv3d takes it unbatched
    with pytest.raises(em.ShapeError, match=r"^layers.0 \(BatchNorm1d\): BatchNorm1d input "
                                            r"must be \(N, C\) or \(N, C, L\), got "
                                            r"\[2, 3, 4, 4, 4\]"):
        em.trace(nn.Sequential(nn.BatchNorm1d(3)), em.TensorSpec((2, 3, 4, 4, 4), "f32"))


IMPORTS = "import {0} as torch\nfrom {0} import nn\nfrom {0}.nn import functional as F\n"
MODEL = '''
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm3d(4)
        self.pool = nn.MaxPool3d(2)
        self.gap = nn.AdaptiveAvgPool3d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return self.fc(self.gap(x).flatten(1))
'''


def _net(imports: str):
    scope: dict = {}
    exec(imports + MODEL, scope)
    return scope["Net"]()


def test_a_small_3d_cnn_trains_as_torchs():
    torch.manual_seed(0)
    theirs, ours = _net(IMPORTS.format("torch")), _net(IMPORTS.format("ember"))
    em.load_torch(ours, theirs.state_dict())
    x, y = _x(4, 2, 4, 6, 6), np.array([0, 2, 1, 2])
    step = em.compile_train_step(ours, nn.functional.cross_entropy, em.optim.SGD(lr=0.1),
                                 backend="cpu")
    opt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    got, want = [], []
    for _ in range(4):
        got.append(float(step(x, y)))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(theirs(torch.tensor(x)), torch.tensor(y))
        loss.backward()
        opt.step()
        want.append(loss.item())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got[-1] < got[0]
    np.testing.assert_allclose(ours.conv.weight.val(), theirs.conv.weight.detach(), rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(ours.bn.running_var.val(), theirs.bn.running_var, rtol=1e-5)
    out = em.compile(ours.valid(), x, backend="cpu")(x)
    np.testing.assert_allclose(out, theirs.eval()(torch.tensor(x)).detach(), rtol=1e-5,
                               atol=1e-5)
