"""Compiled training end to end: the step learns, updates params in place, agrees across
backends and with the hand-written loop, and `ember train` reaches its accuracy target."""

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.runtime.data import digits
from ember.runtime.models import Mlp

BACKENDS = ["interpreter", "cpu"]


@pytest.fixture(scope="module")
def data():
    return digits(seed=0)


def batches(data, n, size=32):
    for i in range(n):
        j = (i * size) % (len(data.x_train) - size)
        yield data.x_train[j:j + size], data.y_train[j:j + size]


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_updates_params_in_place_and_loss_falls(data, backend):
    em.seed(0)
    model = Mlp()
    ids = [p.id for p in model.parameters()]
    step = em.compile_train_step(model, nn.functional.cross_entropy,
                                 optim.SGD(lr=0.1, momentum=0.9), backend=backend)
    assert not any(p.is_initialized for p in model.parameters())
    losses = [step(x, y) for x, y in batches(data, 60)]
    assert [p.id for p in model.parameters()] == ids
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5])
    assert step.stages[0] == "traced" and "autodiff" in step.stages


def test_cpu_and_interpreter_steps_agree(data):
    params = {}
    for backend in BACKENDS:
        em.seed(3)
        model = Mlp()
        step = em.compile_train_step(model, nn.functional.cross_entropy,
                                     optim.Adam(lr=1e-2), backend=backend)
        for x, y in batches(data, 5):
            step(x, y)
        params[backend] = {k: p.val() for k, p in model.named_parameters()}
    for k, v in params["cpu"].items():
        np.testing.assert_allclose(v, params["interpreter"][k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("make_opt", [lambda: optim.SGD(lr=0.1, momentum=0.9, nesterov=True,
                                                        weight_decay=1e-3),
                                      lambda: optim.Adam(lr=1e-2),
                                      lambda: optim.AdamW(lr=1e-2)])
def test_compiled_step_equals_grad_then_opt_step(data, make_opt):
    results = []
    for compiled in (True, False):
        em.seed(1)
        model, opt = Mlp(), make_opt()
        step = em.compile_train_step(model, nn.functional.cross_entropy, opt,
                                     backend="interpreter")
        grad = em.compile_grad(model, nn.functional.cross_entropy, backend="interpreter")
        for x, y in batches(data, 3):
            if compiled:
                step(x, y)
            else:
                opt.step(model, grad(x, y))
        results.append({k: p.val() for k, p in model.named_parameters()})
        assert opt.step_count == 3
    for k in results[0]:
        np.testing.assert_allclose(results[0][k], results[1][k], rtol=1e-5, atol=1e-7)


def test_grads_cover_exactly_the_trainable_params(data):
    em.seed(0)
    model = Mlp()
    model.layers[0].no_grad()
    grads = em.compile_grad(model, nn.functional.cross_entropy, backend="cpu")(
        data.x_train[:16], data.y_train[:16])
    assert len(grads) == 2
    assert grads.get(model.layers[0].weight) is None
    assert grads[model.head.weight].shape == model.head.weight.shape


def test_forward_recompiles_for_new_shapes_with_a_notice(data, capsys):
    em.seed(0)
    model = Mlp()
    fwd = em.compile(model, em.TensorSpec((8, 64)), backend="cpu")
    assert fwd(data.x_test[:8]).shape == (8, 10)
    assert fwd(data.x_test[:5]).shape == (5, 10)
    assert "recompiling" in capsys.readouterr().err


def test_wrong_input_shape_names_module_and_both_shapes():
    em.seed(0)
    with pytest.raises(em.ShapeError) as e:
        em.compile(Mlp(), em.TensorSpec((8, 20)), backend="cpu")
    msg = str(e.value)
    assert "layers.0" in msg and "20" in msg and "64" in msg


def test_unknown_recompute_strategy_is_rejected():
    with pytest.raises(ValueError, match="recompute strategy 'bogus'"):
        em.compile_train_step(Mlp(), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                              recompute="bogus")


def test_the_old_name_checkpoint_still_picks_the_strategy_with_a_warning():
    """`checkpoint=` (now: saving training state) is the deprecated spelling of
    `recompute=`, kept for one release, as is `em.checkpoint_strategies()`."""
    with pytest.warns(DeprecationWarning, match="recompute="):
        step = em.compile_train_step(Mlp(), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                     checkpoint="all")
    assert step.recompute == "all"
    with pytest.warns(DeprecationWarning, match="recompute"):
        grad = em.compile_grad(Mlp(), nn.functional.cross_entropy, checkpoint="balanced")
    assert grad.recompute == "balanced"
    with pytest.warns(DeprecationWarning, match="recompute_strategies"):
        assert em.checkpoint_strategies() == em.recompute_strategies()


def test_ember_train_reaches_90_percent_on_digits(tmp_path, capsys):
    from ember.__main__ import main

    assert main(["train", "--no-progress", "--dump-ir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    final = float(out.strip().splitlines()[-1].split()[-1].rstrip("%")) / 100
    assert final >= 0.90, out
    dumps = sorted(tmp_path.glob("*.mlir"))
    assert dumps and "traced" in dumps[0].name
    from ember.ir import verify
    from ember.ir.parser import parse

    for path in dumps:
        verify(parse(path.read_text()))


def _fit(model, data, opt, backend, epochs=10):
    """10 epochs of 44 steps, the lr annealed to 0 (so the last epoch is a stable one)."""
    import io

    from ember.runtime.train import fit

    return fit(model, data, opt, epochs=epochs, backend=backend, progress=False,
               out=io.StringIO())


def test_digits_mlp_with_adam_reaches_97_percent(data):
    em.seed(0)
    results = _fit(Mlp(), data, optim.Adam(lr=optim.Cosine(1e-2, total_steps=440)), backend="cpu")
    assert results[-1].test_accuracy >= 0.97, results[-1]


def test_digits_cnn_reaches_97_percent():
    from ember.runtime.models import Cnn

    em.seed(0)
    results = _fit(Cnn(), digits(seed=0, image=True),
                   optim.Adam(lr=optim.Cosine(1e-2, total_steps=440)), backend="cpu")
    assert results[-1].test_accuracy >= 0.97, results[-1]


class DropMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(64, 48), nn.Linear(48, 48), nn.Linear(48, 10)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        x = self.drop(nn.functional.relu(self.fc1(x)))
        return self.head(nn.functional.relu(self.fc2(x)))


def test_every_offered_recompute_strategy_trains_exactly_like_none(data):
    from ember.runtime.api import recompute_strategies

    strategies = recompute_strategies()
    assert strategies[0] == "none"
    results, saved = {}, {}
    for strategy in strategies:
        em.seed(0)
        model = DropMlp()
        step = em.compile_train_step(model, nn.functional.cross_entropy, optim.Adam(lr=1e-2),
                                     backend="interpreter", recompute=strategy)
        for x, y in batches(data, 4):
            step(x, y)
        results[strategy] = {k: p.val() for k, p in model.named_parameters()}
        report = step.memory_report()
        assert report["peak_bytes"] >= report["params"] + report["optimizer_state"] > 0
        saved[strategy] = report["saved"]
        assert ("recompute" in step.stages) == (strategy != "none")
    for strategy, params in results.items():  # recomputed dropout draws the same mask
        for k, v in params.items():
            np.testing.assert_array_equal(v, results["none"][k], err_msg=f"{strategy} {k}")
    if "all" in saved:
        assert saved["all"] < saved["none"]


def test_memory_budget_implies_min_cut_and_a_hopeless_one_fails_clearly(data):
    from ember.runtime.api import recompute_strategies

    if "min-cut" not in recompute_strategies():
        pytest.skip("no min-cut recompute in this build")
    em.seed(0)
    step = em.compile_train_step(Mlp(), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend="interpreter", memory_budget=10**9)
    step(data.x_train[:32], data.y_train[:32])
    assert step.graph.attributes["ember.recompute_strategy"] == "min-cut"
    em.seed(0)
    step = em.compile_train_step(Mlp(), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend="interpreter", memory_budget=1000)
    with pytest.raises(ValueError, match="budget"):
        step(data.x_train[:32], data.y_train[:32])


def test_a_step_sees_layers_replaced_or_appended_after_compiling(data):
    """The runtime walks the module tree only when it may have changed (TreeWatch): a layer
    replaced in a list, in place, is what the next step trains."""
    em.seed(0)
    model = Mlp()
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend="cpu")
    x, y = data.x_train[:32], data.y_train[:32]
    step(x, y)
    old = model.layers[0]
    model.layers[0] = nn.Linear(64, old.weight.shape[1])
    before = model.layers[0].weight.val().copy()
    step(x, y)
    assert not np.array_equal(model.layers[0].weight.val(), before)
    assert old.weight.val() is not model.layers[0].weight.val()
