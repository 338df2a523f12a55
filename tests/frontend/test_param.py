"""Params: ids, seeding, laziness that does not depend on read order, map/from_array/copies."""

import copy

import numpy as np
import pytest

import ember as em
from ember import nn


def test_param_id_text_round_trip():
    for value in (0, 1, 31, 32, 2**64 - 1, 0x0123456789ABCDEF):
        pid = em.ParamId(value)
        text = str(pid)
        assert len(text) == 13 and set(text) <= set("0123456789abcdefghijklmnopqrstuv")
        assert em.ParamId.parse(text) == pid and hash(em.ParamId.parse(text)) == hash(pid)
    assert str(em.ParamId(0)) == "0" * 13 and str(em.ParamId(2**64 - 1)) == "fvvvvvvvvvvvv"
    for bad in ("0" * 12, "w" * 13, "ABCDEFGHIJKLM"):
        with pytest.raises(ValueError):
            em.ParamId.parse(bad)
    with pytest.raises(ValueError):
        em.ParamId(2**64)


def _mlp():
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def test_seeded_models_are_equal_whatever_order_values_are_first_read():
    em.seed(0)
    a = _mlp()
    em.seed(0)
    b = _mlp()
    for _, p in a.named_parameters():
        p.val()
    for _, p in reversed(b.named_parameters()):
        p.val()
    for (path, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert x.id == y.id and np.array_equal(x.val(), y.val()), path
    em.seed(1)
    c = _mlp()
    assert all(x.id != y.id and not np.array_equal(x.val(), y.val())
               for x, y in zip(a.parameters(), c.parameters()))


def test_unseeded_ids_are_random():
    em.seed(None)
    assert _mlp().layers[0].weight.id != _mlp().layers[0].weight.id


def test_map_keeps_id_and_trainability():
    p = em.Param((2, 3), em.init.Ones())
    q = p.map(lambda v: v * 3)
    assert q.id == p.id and q.requires_grad and q.kind == "float"
    assert np.array_equal(q.val(), np.full((2, 3), 3, np.float32)) and q.val().dtype == np.float32
    frozen = em.Param((2,), em.init.Zeros(), requires_grad=False)
    assert not frozen.map(lambda v: v + 1).requires_grad


def test_from_array_makes_a_new_initialized_param():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    p, q = em.Param.from_array(a), em.Param.from_array(a)
    assert p.id != q.id and p.is_initialized and p.requires_grad and p.dtype == "f32"
    assert np.array_equal(p.val(), a)
    labels = em.Param.from_array(np.array([1, 2]))
    assert labels.kind == "int" and labels.dtype == "i64" and not labels.requires_grad


def test_copies_share_the_lazy_state_and_id():
    p = em.Param((4,), em.init.Normal(0, 1))
    c = copy.copy(p)
    assert c.id == p.id and not c.is_initialized
    assert c.val() is p.val() and p.is_initialized


def test_set_value_checks_shape_and_casts():
    p = em.Param((2, 2), em.init.Zeros())
    p.set_value(np.ones((2, 2), np.float64))
    assert p.val().dtype == np.float32 and p.val().sum() == 4
    with pytest.raises(ValueError, match=r"shape \[3\] does not match its shape \[2, 2\]"):
        p.set_value(np.ones(3))


def test_kinds_and_flags():
    flag = em.Param.flag(True)
    assert flag.kind == "flag" and flag.dtype == "i1" and bool(flag) and not flag.requires_grad
    assert flag.shape == () and flag.val().shape == () and flag.set_value(False).val().shape == ()
    with pytest.raises(TypeError, match="no truth value"):
        bool(em.Param((1,), em.init.Zeros()))
    with pytest.raises(ValueError, match="cannot require gradients"):
        em.Param((1,), em.init.Zeros(), kind="buffer", requires_grad=True)
    with pytest.raises(ValueError, match="int Param cannot have dtype f32"):
        em.Param((1,), em.init.Zeros(), kind="int")


def test_a_param_is_not_a_tensor_outside_a_trace():
    p = em.Param((2,), em.init.Zeros())
    with pytest.raises(RuntimeError, match="only while tracing"):
        p + 1
    assert p != em.Param((2,), em.init.Zeros()) and p == p  # identity outside a trace


class _Device:
    """A stand-in for a device array: counts its copies to the host."""

    def __init__(self, a):
        self.a, self.copies = a, 0

    def to_host(self, x):
        assert x is self
        self.copies += 1
        return self.a


def test_a_device_value_is_copied_to_the_host_once_and_only_when_read():
    p = em.Param((2, 3), em.init.Zeros())
    dev = _Device(np.arange(6, dtype=np.float64).reshape(2, 3))
    p.set_device_value(dev, dev.to_host)
    assert p.is_initialized and dev.copies == 0 and p.device_value() is dev
    clone = copy.copy(p)
    v = p.val()
    assert v.dtype == np.float32 and v.flags.c_contiguous and dev.copies == 1
    np.testing.assert_array_equal(clone.val(), v)  # the copy is shared with clones
    assert dev.copies == 1 and p.val() is v
    assert p.device_value() is dev  # reading leaves the device value current


@pytest.mark.parametrize("rebind", ["set_value", "runtime"])
def test_a_host_rebinding_retires_the_device_value(rebind):
    p = em.Param((2,), em.init.Zeros())
    dev = _Device(np.ones(2, np.float32))
    p.set_device_value(dev, dev.to_host)
    new = np.full(2, 5, np.float32)
    if rebind == "set_value":
        p.set_value(new)
    else:  # the cpu training step's fast path assigns the value it returned directly
        p.val()
        p._value = new
    assert p.device_value() is None and p.val() is new and dev.copies <= 1


def _trains(lin):
    """Whether a training step moves `lin.weight` (a constant in its place would not)."""
    from ember import optim

    before = lin.weight.val().copy()
    step = em.compile_train_step(lin, lambda out, y: (out * out).mean(), optim.SGD(lr=0.5),
                                 backend="interpreter")
    x = np.ones((4, lin.d_in), np.float32)
    step(x, x[:, :lin.d_out])
    return not np.array_equal(lin.weight.val(), before)


def test_an_array_assigned_over_a_param_sets_its_value():
    """`lin.weight = array` made the weight a constant (training then moved only the
    bias), and `lin.weight.data = array` set an attribute nothing read: both set the
    value of the same Param now, which goes on training."""
    lin = nn.Linear(3, 2)
    pid = lin.weight.id
    lin.weight = np.ones((3, 2))
    assert isinstance(lin.weight, em.Param) and lin.weight.id == pid
    assert lin.weight.val().dtype == np.float32
    np.testing.assert_array_equal(lin.weight.val(), np.ones((3, 2)))
    lin.weight.data = np.full((3, 2), 2.0)
    assert lin.weight.id == pid and lin.weight.data.dtype == np.float32
    np.testing.assert_array_equal(lin.weight.val(), np.full((3, 2), 2.0))
    assert _trains(lin)
    lin.bias = None  # an optional param may still be dropped
    assert lin.bias is None


def test_a_torch_tensor_assigned_over_a_param_sets_its_value():
    torch = pytest.importorskip("torch")
    lin = nn.Linear(3, 2)
    pid = lin.weight.id
    t = torch.nn.Parameter(torch.arange(6.0).reshape(3, 2))  # requires grad: numpy refuses it
    lin.weight = t
    assert lin.weight.id == pid
    np.testing.assert_array_equal(lin.weight.val(), t.detach().numpy())
    lin.bias.data = torch.ones(2, dtype=torch.bfloat16)  # numpy has no bf16
    np.testing.assert_array_equal(lin.bias.val(), np.ones(2, np.float32))
    lin.weight = torch.zeros(3, 2, dtype=torch.float64)
    assert lin.weight.val().dtype == np.float32 and not lin.weight.val().any()
    lin.load_state_dict({"weight": t, "bias": torch.full((2,), 3.0, dtype=torch.bfloat16)})
    np.testing.assert_array_equal(lin.bias.val(), np.full(2, 3.0, np.float32))
    assert _trains(lin)


def test_a_value_of_another_shape_or_not_numbers_is_refused_and_changes_nothing():
    lin = nn.Linear(3, 2)
    before = lin.weight.val().copy()
    with pytest.raises(ValueError, match=r"cannot assign a value of shape \[2, 3\] to "
                                         r"Linear.weight, a parameter of shape \[3, 2\] "
                                         r"\(ember's Linear weights are \[d_in, d_out\]"):
        lin.weight = np.ones((2, 3))
    with pytest.raises(ValueError, match=r"shape \[4\] to Linear.bias, a parameter of shape "
                                         r"\[2\]$"):
        lin.bias = np.ones(4)
    with pytest.raises(TypeError, match="cannot assign a str to Linear.weight, a parameter: "
                                        ".*not an array of real numbers"):
        lin.weight = "ones"
    with pytest.raises(ValueError, match=r"shape \[2, 3\] does not match its shape \[3, 2\]"):
        lin.weight.data = np.ones((2, 3))
    np.testing.assert_array_equal(lin.weight.val(), before)
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"shape \[2, 3\] to Linear.weight, a parameter of "
                                         r"shape \[3, 2\]"):
        lin.weight = torch.nn.Linear(3, 2).weight  # PyTorch's layout: [out, in]
    with pytest.raises(ValueError, match="does not match its shape"):
        lin.weight.data = torch.ones(2, 3)
    np.testing.assert_array_equal(lin.weight.val(), before)


def test_a_param_or_module_assigned_over_a_param_replaces_it():
    lin = nn.Linear(3, 2)
    new = em.Param.from_array(np.zeros((3, 5), np.float32))
    lin.weight = new
    assert lin.weight is new


def test_a_bool_assigned_over_a_flag_sets_the_mode_as_pytorchs_training_attribute():
    drop = nn.Dropout(0.5)
    flag = drop.training
    drop.training = False
    assert drop.training is flag and not bool(drop.training)
    drop.training = True
    assert bool(drop.training)
