"""Optimizer param groups with settings of their own, as PyTorch's: against torch.optim in a
compiled step (interpreter and cpu) and in `opt.step`, a group's lr changed between steps
without recompiling, checkpoints, and the errors."""

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.ir.parser import parse
from ember.passes.manager import PipelineError, parse_pipeline
from ember.runtime.checkpoint import CheckpointError


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(nn.functional.relu(self.fc1(x)))


def batches(n, dtype=np.float64):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((12, 8)).astype(dtype), rng.integers(0, 4, 12))
            for _ in range(n)]


def twins(torch):
    """The same MLP in ember and torch (float64: Adam's normalization turns float32 rounding
    noise in near-zero gradients into lr-sized steps), and each one's (weights, biases)."""
    torch.manual_seed(0)
    tnet = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4)).double()
    net = Net()
    for layer, t in ((net.fc1, tnet[0]), (net.fc2, tnet[2])):
        layer.weight = em.Param.from_array(t.weight.detach().numpy().T.copy())
        layer.bias = em.Param.from_array(t.bias.detach().numpy().copy())
    ours = ([net.fc1.weight, net.fc2.weight], [net.fc1.bias, net.fc2.bias])
    theirs = ([tnet[0].weight, tnet[2].weight], [tnet[0].bias, tnet[2].bias])
    return net, tnet, ours, theirs


def torch_step(torch, tnet, topt, x, y):
    topt.zero_grad()
    torch.nn.functional.cross_entropy(tnet(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    topt.step()


def assert_same_params(net, tnet, rtol=1e-6):
    for ours, theirs in ((net.fc1, tnet[0]), (net.fc2, tnet[2])):
        np.testing.assert_allclose(ours.weight.val(), theirs.weight.detach().numpy().T,
                                   rtol=rtol, atol=1e-9)
        np.testing.assert_allclose(ours.bias.val(), theirs.bias.detach().numpy(),
                                   rtol=rtol, atol=1e-9)


def adamw_groups(weights, biases):
    """Decay on the weights, none on the biases (its own lr too)."""
    return [{"params": weights, "weight_decay": 0.1},
            {"params": biases, "weight_decay": 0.0, "lr": 3e-2}]


def sgd_groups(weights, biases):
    """Momentum on the weights, nesterov with its own lr and a weight decay on the biases."""
    return [{"params": weights},
            {"params": biases, "lr": 0.02, "momentum": 0.5, "nesterov": True,
             "weight_decay": 1e-3}]


OPTIMIZERS = {
    "adamw": (lambda groups: optim.AdamW(adamw_groups(*groups), lr=1e-2),
              lambda torch, groups: torch.optim.AdamW(adamw_groups(*groups), lr=1e-2)),
    "sgd-momentum": (lambda groups: optim.SGD(sgd_groups(*groups), lr=0.1, momentum=0.9),
                     lambda torch, groups: torch.optim.SGD(sgd_groups(*groups), lr=0.1,
                                                           momentum=0.9)),
}


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_groups_train_as_pytorchs(name, backend):
    torch = pytest.importorskip("torch")
    net, tnet, ours, theirs = twins(torch)
    make, make_torch = OPTIMIZERS[name]
    opt, topt = make(ours), make_torch(torch, theirs)
    step = em.compile_train_step(net, nn.functional.cross_entropy, opt, backend=backend)
    for x, y in batches(8):
        step(x, y)
        torch_step(torch, tnet, topt, x, y)
    assert_same_params(net, tnet)
    assert step.compiles == 1


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_a_groups_lr_changed_between_steps_is_fed_without_recompiling(backend, capsys):
    torch = pytest.importorskip("torch")
    net, tnet, ours, theirs = twins(torch)
    opt = optim.AdamW(adamw_groups(*ours), lr=1e-2)
    topt = torch.optim.AdamW(adamw_groups(*theirs), lr=1e-2)
    step = em.compile_train_step(net, nn.functional.cross_entropy, opt, backend=backend)
    for i, (x, y) in enumerate(batches(9)):
        if i in (3, 6):  # as a torch scheduler does it: a new lr in the group's dict
            for group in (opt.param_groups[0], topt.param_groups[0]):
                group["lr"] = group["lr"] / 10
        step(x, y)
        torch_step(torch, tnet, topt, x, y)
    assert_same_params(net, tnet)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-4)
    assert step.compiles == 1 and "recompiling" not in capsys.readouterr().err


def test_a_groups_compiled_in_setting_changed_recompiles_and_takes_effect(capsys):
    torch = pytest.importorskip("torch")
    net, tnet, ours, theirs = twins(torch)
    opt = optim.SGD(sgd_groups(*ours), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(sgd_groups(*theirs), lr=0.1, momentum=0.9)
    step = em.compile_train_step(net, nn.functional.cross_entropy, opt, backend="cpu")
    for i, (x, y) in enumerate(batches(6)):
        if i == 3:
            for group in (opt.param_groups[1], topt.param_groups[1]):
                group["weight_decay"] = 0.5
        step(x, y)
        torch_step(torch, tnet, topt, x, y)
    assert_same_params(net, tnet)
    assert step.compiles == 2 and "recompiling train_step" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_opt_step_with_groups_equals_the_compiled_step(name):
    results = []
    for compiled in (True, False):
        em.seed(3)
        net = Net()
        opt = OPTIMIZERS[name][0](([net.fc1.weight, net.fc2.weight], [net.fc1.bias, net.fc2.bias]))
        step = em.compile_train_step(net, nn.functional.cross_entropy, opt,
                                     backend="interpreter")
        grad = em.compile_grad(net, nn.functional.cross_entropy, backend="interpreter")
        for i, (x, y) in enumerate(batches(5, np.float32)):
            if i == 3:
                opt.param_groups[1]["lr"] = 1e-3
            step(x, y) if compiled else opt.step(net, grad(x, y))
        results.append({k: v.copy() for k, v in net.state_dict().items()})
    for k in results[0]:
        np.testing.assert_allclose(results[0][k], results[1][k], rtol=1e-5, atol=1e-7,
                                   err_msg=k)


def test_each_group_has_its_own_lr_input_in_the_lowered_update():
    em.seed(0)
    net = Net()
    opt = optim.AdamW(adamw_groups([net.fc1.weight, net.fc2.weight],
                                   [net.fc1.bias, net.fc2.bias]), lr=1e-2)
    step = em.compile_train_step(net, nn.functional.cross_entropy, opt, backend="interpreter")
    step(*batches(1, np.float32)[0])
    assert "ember.param_groups" in step.ir("traced")
    text = step.ir("optimizer")
    assert "%lr: tensor<f32>, %lr1: tensor<f32>, %step: tensor<f32>" in text
    assert "ember.param_groups" not in text
    assert "groups=;weight_decay=0.0" in opt.pass_spec()
    assert optim.AdamW(lr=1e-2).pass_spec() == ("optimizer{kind=adamw beta1=0.9 beta2=0.999 "
                                                "eps=1e-08 weight_decay=0.01}")


def test_param_groups_have_pytorchs_shape_and_optimizer_wide_settings_set_every_group():
    em.seed(0)
    net = Net()
    weights, biases = [net.fc1.weight, net.fc2.weight], [net.fc1.bias, net.fc2.bias]
    opt = optim.AdamW(adamw_groups(weights, biases), lr=1e-2)
    first, second = opt.param_groups
    assert isinstance(first, dict) and list(first["params"]) == weights
    assert dict(second, params=None) == {"params": None, "lr": 3e-2, "betas": (0.9, 0.999),
                                         "eps": 1e-8, "weight_decay": 0.0}
    assert first["lr"] == 1e-2 and opt.defaults["weight_decay"] == 0.01
    opt.lr = 5e-3  # optimizer-wide: the default and every group
    opt.beta2 = 0.99
    assert [g["lr"] for g in opt.param_groups] == [5e-3, 5e-3] and opt.lr == 5e-3
    assert [g["betas"] for g in opt.param_groups] == [(0.9, 0.99)] * 2
    opt.param_groups[1]["lr"] = optim.StepLR(0.1, step_size=1, gamma=0.5)  # a schedule too
    opt.step_count = 2
    assert opt.group_lrs() == [5e-3, 0.025]
    plain = optim.SGD(lr=0.1)  # ember's spelling: one group of every param
    assert plain.param_groups == [{"params": None, "lr": 0.1, "momentum": 0.0,
                                   "weight_decay": 0.0, "nesterov": False}]
    assert plain.param_ids is None
    opt.add_param_group({"params": [em.Param.from_array(np.zeros(3))], "eps": 1e-6})
    assert opt.param_groups[2]["eps"] == 1e-6 and opt.param_groups[2]["lr"] == 5e-3
    assert "param_groups=[{'params': 2, 'weight_decay': 0.1}" in repr(opt)


def test_config_round_trips_the_groups_over_the_live_optimizers_params():
    em.seed(0)
    net = Net()
    opt = optim.SGD(sgd_groups([net.fc1.weight, net.fc2.weight], [net.fc1.bias, net.fc2.bias]),
                    lr=0.1, momentum=0.9)
    config = opt.config()
    assert len(config["options"]["param_groups"]) == 2
    again = optim.from_config(config, like=opt)
    assert again.config() == config
    assert [g["params"] for g in again.param_groups] == [g["params"] for g in opt.param_groups]
    with pytest.raises(ValueError, match="like=opt"):
        optim.from_config(config)
    with pytest.raises(ValueError, match="2 param group\\(s\\), the optimizer 1"):
        optim.from_config(config, like=optim.SGD(net.parameters(), lr=0.1))
    assert "param_groups" not in optim.SGD(net.parameters(), lr=0.1).config()["options"]


def test_a_checkpoint_keeps_each_groups_settings_and_resumes_exactly(tmp_path):
    data = batches(6, np.float32)

    def run(resume_at=None):
        em.seed(0)
        net = Net()
        opt = optim.AdamW(adamw_groups([net.fc1.weight, net.fc2.weight],
                                       [net.fc1.bias, net.fc2.bias]), lr=1e-2)
        step = em.compile_train_step(net, nn.functional.cross_entropy, opt, backend="cpu")
        for i, (x, y) in enumerate(data):
            if i == 2:
                opt.param_groups[1]["lr"] = 1e-3
            if i == resume_at:
                step.save_checkpoint(str(tmp_path / "run.ckpt"))
                opt.param_groups[1]["lr"] = 0.5  # overwritten by the load
                opt.param_groups[0]["weight_decay"] = 0.7
                step.load_checkpoint(str(tmp_path / "run.ckpt"))
            step(x, y)
        return net.state_dict(), opt

    want, _ = run()
    got, opt = run(resume_at=4)
    assert opt.param_groups[1]["lr"] == 1e-3 and opt.param_groups[0]["weight_decay"] == 0.1
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    em.seed(0)
    net = Net()
    other = em.compile_train_step(net, nn.functional.cross_entropy,
                                  optim.AdamW(net.parameters(), lr=1e-2), backend="cpu")
    with pytest.raises(CheckpointError, match="2 param group\\(s\\), the optimizer 1"):
        other.load_checkpoint(str(tmp_path / "run.ckpt"))


# -- errors -----------------------------------------------------------------------------------

def test_a_param_in_two_groups_is_refused_naming_it():
    em.seed(0)
    net = Net()
    w = net.fc1.weight
    with pytest.raises(ValueError, match=f"param {w.id} \\(\\[8, 16\\] f32\\) is in param "
                                         "groups 0 and 1: a param may be in one group only"):
        optim.AdamW([{"params": [w, net.fc2.weight]}, {"params": [w], "weight_decay": 0.0}])
    with pytest.raises(ValueError, match="twice in one param group"):
        optim.SGD([w, w], lr=0.1)
    opt = optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="in param groups 0 and 1"):
        opt.add_param_group({"params": [net.fc2.bias], "lr": 0.5})
    with pytest.raises(ValueError, match="cannot share the optimizer"):
        optim.SGD(lr=0.1).add_param_group({"params": [w]})


def test_unknown_or_bad_group_settings_are_refused():
    em.seed(0)
    net = Net()
    with pytest.raises(ValueError, match="SGD has no setting 'dampening' \\(its settings: lr, "
                                         "momentum, weight_decay, nesterov\\)"):
        optim.SGD([{"params": net.parameters(), "dampening": 0.1}], lr=0.1)
    with pytest.raises(ValueError, match="AdamW has no setting 'momentum'"):
        optim.AdamW([{"params": net.parameters(), "momentum": 0.9}])
    with pytest.raises(ValueError, match="clip_norm clips the gradients of all params"):
        optim.Adam([{"params": net.parameters(), "clip_norm": 1.0}])
    with pytest.raises(ValueError, match="nesterov momentum needs momentum > 0"):
        optim.SGD([{"params": net.parameters(), "nesterov": True}], lr=0.1)
    with pytest.raises(ValueError, match="needs its 'params'"):
        optim.SGD([{"lr": 0.1}])
    opt = optim.AdamW(net.parameters(), lr=1e-3)
    group = opt.param_groups[0]
    for key, value, match in (("lr", float("nan"), "learning rate must be a finite number"),
                              ("betas", (0.9,), "betas must be a pair"),
                              ("weight_decay", -1.0, "weight_decay must be a finite number"),
                              ("initial_lr", 1e-3, "AdamW has no setting 'initial_lr'"),
                              ("params", [], "params cannot be replaced")):
        with pytest.raises(ValueError, match=match):
            group[key] = value
    assert group["lr"] == 1e-3 and group["weight_decay"] == 0.01  # nothing was written


def test_a_compiled_step_refuses_groups_that_miss_a_trainable_param():
    em.seed(0)
    net = Net()
    opt = optim.AdamW([{"params": [net.fc1.weight, net.fc2.weight]},
                       {"params": [net.fc2.bias], "weight_decay": 0.0}])
    with pytest.raises(ValueError, match="given 3 params.*1 of them are not among those "
                                         "\\(fc1.bias\\)"):
        em.compile_train_step(net, nn.functional.cross_entropy, opt, backend="cpu")
    net.fc1.bias.requires_grad = False  # frozen: the groups need not hold it
    step = em.compile_train_step(net, nn.functional.cross_entropy, opt, backend="cpu")
    step(*batches(1, np.float32)[0])
    net.fc2.bias = em.Param.from_array(np.zeros(4, np.float32))  # a new param, in no group
    with pytest.raises(PipelineError, match="fc2.bias get gradients but are in no param group"):
        step(*batches(1, np.float32)[0])


def test_the_pass_refuses_groups_it_cannot_place():
    em.seed(0)
    net = Net()
    step = em.compile_train_step(net, nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend="interpreter")
    step(*batches(1, np.float32)[0])
    text = step.ir("decompose")  # one group: no ember.param_groups
    for spec, match in (("optimizer{kind=sgd groups=;kind=adam}", "other than kind"),
                        ("optimizer{kind=sgd groups=;momentum=zz}", "bad value 'zz'"),
                        ("optimizer{kind=sgd groups=;momentum=0.5}", "needs ember.param_groups")):
        (lower,) = parse_pipeline(spec)
        with pytest.raises(PipelineError, match=match):
            lower.apply(parse(text))
