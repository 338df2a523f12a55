"""Initializers: burn's formulas, the text on `ember.param`, and errors without fans."""

import math

import numpy as np
import pytest

import ember as em
from ember import nn

RNG = np.random.default_rng(0)


def test_linear_default_init_is_uniform_one_over_sqrt_fan_in():
    layer = nn.Linear(256, 64)
    w, b = layer.weight.val(), layer.bias.val()
    bound = 1 / math.sqrt(256)
    assert bound == 0.0625 and np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert np.abs(w).max() >= 0.99 * bound
    assert str(layer.weight.init) == "kaiming_uniform(gain=0.5773502691896258, fan_out_only=False)"


def test_xavier_uniform_bound():
    w = nn.Linear(256, 64, init=em.init.XavierUniform()).weight.val()
    bound = math.sqrt(3) * math.sqrt(2 / (256 + 64))
    assert round(bound, 5) == 0.13693
    assert np.abs(w).max() <= bound and np.abs(w).max() >= 0.99 * bound


@pytest.mark.parametrize("init, std", [
    (em.init.KaimingNormal(gain=2.0), 2.0 / math.sqrt(400)),
    (em.init.KaimingNormal(gain=1.0, fan_out_only=True), 1 / math.sqrt(100)),
    (em.init.XavierNormal(gain=1.5), 1.5 * math.sqrt(2 / 500)),
    (em.init.Normal(0.5, 0.2), 0.2),
])
def test_normal_initializers_std(init, std):
    v = init((400, 100), RNG, fan_in=400, fan_out=100)
    assert abs(v.std() / std - 1) < 0.02


def test_simple_initializers():
    assert np.array_equal(em.init.Constant(2.5)((2,), RNG), [2.5, 2.5])
    assert em.init.Ones()((3,), RNG).sum() == 3 and not em.init.Zeros()((3,), RNG).any()
    u = em.init.Uniform(-2, -1)((1000,), RNG)
    assert u.min() >= -2 and u.max() <= -1
    assert str(em.init.Uniform(-2, -1)) == "uniform(lo=-2, hi=-1)"


def test_orthogonal():
    for shape in [(4, 6), (6, 4), (3, 2, 2)]:
        w = em.init.Orthogonal(gain=2.0)(shape, RNG).reshape(shape[0], -1)
        small = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        assert np.allclose(small, 4 * np.eye(len(small)))
    with pytest.raises(ValueError, match="rank >= 2"):
        em.Param((4,), em.init.Orthogonal())


def test_fan_initializers_without_fans_fail_when_the_param_is_made():
    with pytest.raises(ValueError, match="KaimingUniform needs fan_in"):
        em.Param((4, 4), em.init.KaimingUniform())
    with pytest.raises(ValueError, match="KaimingNormal needs fan_out"):
        em.Param((4, 4), em.init.KaimingNormal(fan_out_only=True), fan_in=4)
    with pytest.raises(ValueError, match="XavierUniform needs fan_in and fan_out"):
        em.Param((4, 4), em.init.XavierUniform(), fan_in=4)
    with pytest.raises(ValueError, match="needs fan_in"):
        em.init.KaimingUniform()((2,), RNG)
