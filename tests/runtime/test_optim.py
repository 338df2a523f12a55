"""Optimizers against PyTorch, state keyed by ParamId, schedules, clipping, frozen params."""

import math

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.runtime.data import digits


class Net(nn.Module):
    def __init__(self, d_in=64, hidden=32, d_out=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(nn.functional.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def data():
    return digits(seed=0)


def batch(data, i, size=32, dtype=np.float32):
    rows = slice(i * size, (i + 1) * size)
    return data.x_train[rows].astype(dtype), data.y_train[rows]


def values(model):
    return {k: p.val().copy() for k, p in model.named_parameters()}


# -- PyTorch parity ------------------------------------------------------------------------

TORCH_OPTS = {
    "sgd-momentum": (lambda: optim.SGD(lr=0.1, momentum=0.9),
                     lambda torch, ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
    "adam": (lambda: optim.Adam(lr=1e-2), lambda torch, ps: torch.optim.Adam(ps, lr=1e-2)),
    "adamw-clipped": (lambda: optim.AdamW(lr=1e-2, clip_norm=0.1),
                      lambda torch, ps: torch.optim.AdamW(ps, lr=1e-2)),
}


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
@pytest.mark.parametrize("name", list(TORCH_OPTS))
def test_twenty_steps_match_pytorch(data, name, backend):
    """The same MLP, weights imported from torch, 20 steps on the same batches: every
    element of every param within 1e-5 relative. In float64: in float32 the gradient
    entries that are sums cancelling to rounding noise differ between any two matmul
    orders, and Adam's normalization turns that noise into lr-sized steps."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    tnet = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 10)).double()
    net = Net()
    sd = {k: v.numpy() for k, v in tnet.state_dict().items()}
    net.fc1.weight, net.fc1.bias = em.Param.from_array(sd["0.weight"].T), em.Param.from_array(
        sd["0.bias"])
    net.fc2.weight, net.fc2.bias = em.Param.from_array(sd["2.weight"].T), em.Param.from_array(
        sd["2.bias"])
    make, make_torch = TORCH_OPTS[name]
    opt = make()
    topt = make_torch(torch, tnet.parameters())
    step = em.compile_train_step(net, nn.functional.cross_entropy, opt, backend=backend)
    for i in range(20):
        x, y = batch(data, i, dtype=np.float64)
        step(x, y)
        topt.zero_grad()
        torch.nn.functional.cross_entropy(tnet(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        if opt.clip_norm:
            torch.nn.utils.clip_grad_norm_(tnet.parameters(), opt.clip_norm)
        topt.step()
    got = {k: p.val() for k, p in net.named_parameters()}
    want = {k.replace("0.", "fc1.").replace("2.", "fc2."): v.detach().numpy()
            for k, v in tnet.state_dict().items()}
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v.T if k.endswith("weight") else v, rtol=1e-5,
                                   atol=0, err_msg=k)


def test_clipping_bounds_the_global_norm_and_matches_pytorch():
    torch = pytest.importorskip("torch")
    g = {"a": np.array([3.0, 4.0]), "b": np.array([[12.0]])}  # global norm 13
    model = _Two()
    grads = em.GradientsParams({model.a.id: g["a"], model.b.id: g["b"]})
    optim.SGD(lr=1.0, clip_norm=1.3).step(model, grads)  # clipped to norm 1.3
    ta, tb = (torch.zeros(v.shape, dtype=torch.float64, requires_grad=True) for v in g.values())
    ta.grad, tb.grad = (torch.from_numpy(v.copy()) for v in g.values())
    torch.nn.utils.clip_grad_norm_([ta, tb], 1.3)
    np.testing.assert_allclose(-model.a.val(), ta.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(-model.b.val(), tb.grad.numpy(), rtol=1e-12)
    assert np.isclose(np.sqrt((model.a.val() ** 2).sum() + (model.b.val() ** 2).sum()), 1.3)


class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = em.Param((2,), em.init.Zeros(), "f64")
        self.b = em.Param((1, 1), em.init.Zeros(), "f64")


def test_schedules_follow_their_pytorch_schedulers():
    torch = pytest.importorskip("torch")
    sched = torch.optim.lr_scheduler

    def torch_lrs(make, n):
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        s, out = make(opt), []
        for _ in range(n):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            s.step()
        return out

    cases = [
        (optim.StepLR(0.1, step_size=3, gamma=0.5), lambda o: sched.StepLR(o, 3, 0.5)),
        (optim.Cosine(0.1, total_steps=10, min_lr=0.01),
         lambda o: sched.CosineAnnealingLR(o, T_max=10, eta_min=0.01)),
        (optim.LinearWarmup(optim.Cosine(0.1, total_steps=8), warmup_steps=4),
         lambda o: sched.SequentialLR(o, [sched.LinearLR(o, 1 / 3, total_iters=4),
                                          sched.CosineAnnealingLR(o, T_max=8)], [4])),
    ]
    for ours, theirs in cases:
        np.testing.assert_allclose([ours(t) for t in range(11)], torch_lrs(theirs, 11),
                                   rtol=1e-9, atol=1e-12, err_msg=repr(ours))
    assert optim.Cosine(0.1, total_steps=10)(25) == 0.0  # stays at min_lr after the end


def test_schedule_is_fed_every_step_without_recompiling(data, capsys):
    em.seed(0)
    model = Net()
    opt = optim.SGD(lr=optim.StepLR(0.5, step_size=2, gamma=0.0 + 1e-9))
    step = em.compile_train_step(model, nn.functional.cross_entropy, opt, backend="cpu")
    before = values(model)
    for i in range(2):
        step(*batch(data, i))
    moved = values(model)
    for i in range(2, 4):  # lr is now 5e-10: params barely move
        step(*batch(data, i))
    after = values(model)
    assert not np.allclose(before["fc1.weight"], moved["fc1.weight"])
    np.testing.assert_allclose(after["fc1.weight"], moved["fc1.weight"], atol=1e-8)
    assert "recompiling" not in capsys.readouterr().err
    assert opt.config()["schedule"]["kind"] == "StepLR"
    assert optim.from_config(opt.config()).schedule == opt.schedule


# -- state keyed by ParamId ----------------------------------------------------------------

def test_param_map_keeps_adam_moments_and_from_array_starts_fresh(data):
    runs = []
    for remap in (False, True):
        em.seed(0)
        model, opt = Net(), optim.Adam(lr=1e-2)
        step = em.compile_train_step(model, nn.functional.cross_entropy, opt, backend="interpreter")
        for i in range(3):
            step(*batch(data, i))
        pid = model.fc1.weight.id
        if remap:  # same id: the moments carry on as if nothing happened
            model.fc1.weight = model.fc1.weight.map(lambda v: v.copy())
            assert model.fc1.weight.id == pid
        step(*batch(data, 3))
        runs.append((values(model), {k: v.copy() for k, v in opt.state[pid].items()}))
    for k in runs[0][0]:
        np.testing.assert_array_equal(runs[0][0][k], runs[1][0][k])
    for k in runs[0][1]:
        np.testing.assert_array_equal(runs[0][1][k], runs[1][1][k])

    model.fc1.weight = em.Param.from_array(model.fc1.weight.val())  # new id: fresh state
    new = model.fc1.weight.id
    assert new != pid and new not in opt.state
    g = _grad(model, data, 4)
    step(*batch(data, 4))
    np.testing.assert_allclose(opt.state[new]["exp_avg"], 0.1 * g, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(opt.state[new]["exp_avg_sq"], 0.001 * g * g, rtol=1e-4,
                               atol=1e-12)


def _grad(model, data, i):
    return em.compile_grad(model, nn.functional.cross_entropy, backend="interpreter")(
        *batch(data, i))[model.fc1.weight]


def test_params_update_in_place_ids_unchanged_and_val_sees_new_values(data):
    em.seed(0)
    model = Net()
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend="cpu")
    ids = {k: p.id for k, p in model.named_parameters()}
    objs = {k: p for k, p in model.named_parameters()}
    step(*batch(data, 0))
    first = values(model)
    step(*batch(data, 1))
    assert {k: p.id for k, p in model.named_parameters()} == ids
    assert all(objs[k] is p for k, p in model.named_parameters())
    assert not np.array_equal(first["fc2.weight"], model.fc2.weight.val())


# -- the burn freeze experiment ------------------------------------------------------------

@pytest.mark.parametrize("how", ["no_grad", "group"])
def test_frozen_fc1_gets_no_grads_stays_put_and_survives_valid_train(data, how):
    em.seed(0)
    model = Net()
    if how == "no_grad":
        model.fc1.no_grad()
    else:
        model.set_require_grad_group(em.ParamGroup.from_predicate("fc1."), False)
    grads = em.compile_grad(model, nn.functional.cross_entropy, backend="cpu")(*batch(data, 0))
    assert len(grads) == 2
    assert grads.get(model.fc1.weight) is None and model.fc2.weight in grads
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.Adam(lr=1e-2),
                                 backend="cpu")
    for round_ in range(2):
        before = values(model)
        step(*batch(data, round_))
        after = values(model)
        for k in ("fc1.weight", "fc1.bias"):
            np.testing.assert_array_equal(before[k], after[k])
        assert not np.array_equal(before["fc2.weight"], after["fc2.weight"])
        model.valid().train()  # the frozen state survives the mode switches
        assert not model.fc1.weight.requires_grad and model.fc2.weight.requires_grad
    regrads = em.compile_grad(model, nn.functional.cross_entropy, backend="cpu")(
        *batch(data, 1))
    assert len(regrads) == 2


def test_opt_step_by_hand_applies_the_same_clipped_update(data):
    results = []
    for compiled in (True, False):
        em.seed(5)
        model, opt = Net(), optim.SGD(lr=0.1, momentum=0.9, clip_norm=0.05)
        step = em.compile_train_step(model, nn.functional.cross_entropy, opt,
                                     backend="interpreter")
        grad = em.compile_grad(model, nn.functional.cross_entropy, backend="interpreter")
        for i in range(3):
            step(*batch(data, i)) if compiled else opt.step(model, grad(*batch(data, i)))
        results.append(values(model))
    for k in results[0]:
        np.testing.assert_allclose(results[0][k], results[1][k], rtol=1e-5, atol=1e-7)


def test_bad_optimizer_settings_are_rejected():
    with pytest.raises(ValueError, match="learning rate"):
        optim.Adam(lr=0.0)
    with pytest.raises(ValueError, match="clip_norm"):
        optim.SGD(lr=0.1, clip_norm=-1.0)
    with pytest.raises(ValueError, match="total_steps"):
        optim.Cosine(0.1, total_steps=0)
    for make, name in ((lambda: optim.SGD(lr=math.inf), "learning rate"),
                       (lambda: optim.SGD(lr=0.1, momentum=math.nan), "momentum"),
                       (lambda: optim.AdamW(weight_decay=-1.0), "weight_decay"),
                       (lambda: optim.Adam(betas=(0.9, 1.0)), "beta2"),
                       (lambda: optim.Adam(eps=math.nan), "eps")):
        with pytest.raises(ValueError, match=f"{name} must be a finite number"):
            make()
    opt = optim.SGD(lr=0.1)
    with pytest.raises(ValueError, match="learning rate"):
        opt.lr = math.nan


def test_pytorchs_spelling_with_the_params_first():
    """`optim.AdamW(model.parameters(), lr=1e-3)` raised 'got multiple values for argument
    lr'. The params are taken (param groups too: test_param_groups.py); a compiled step
    updates every param that requires grad, so a subset is refused there (it would train the
    others silently), while `opt.step` with gradients updates only the params it was given,
    as PyTorch's does."""
    em.seed(0)
    model = Net()
    x, y = digits().x_train[:16], digits().y_train[:16]
    ours = em.compile_train_step(model, nn.functional.cross_entropy,
                                 optim.AdamW(model.parameters(), lr=1e-3), backend="cpu")
    assert np.isfinite(ours(x, y))
    assert optim.SGD(0.1).lr == 0.1 and optim.Adam([{"params": model.parameters()}]).lr == 1e-3
    with pytest.raises(ValueError, match="given 2 params.*2 of them are not among those "
                                         "\\(fc1.weight, fc1.bias\\): freeze them"):
        em.compile_train_step(model, nn.functional.cross_entropy,
                              optim.SGD(model.fc2.parameters(), lr=0.1), backend="cpu")
    assert optim.SGD([{"params": model.parameters(), "lr": 0.1}]).param_groups[0]["lr"] == 0.1
    with pytest.raises(TypeError, match="give the learning rate once"):
        optim.SGD(0.1, 0.2)
    head = optim.SGD(model.fc2.parameters(), lr=0.5)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    head.step(model, em.compile_grad(model, nn.functional.cross_entropy,
                                     backend="interpreter")(x, y))
    after = model.state_dict()
    assert all(np.array_equal(after[k], before[k]) for k in ("fc1.weight", "fc1.bias"))
    assert not np.array_equal(after["fc2.weight"], before["fc2.weight"])
