"""A feedback run's bound call (backends/cpu/call/bound.py) for a caller that checks its fed
inputs itself: the turn it may call, when it must not, and scratch results."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends import cpu
from ember.backends.cpu.call import binding as guard
from ember.ir import Builder, Graph, TensorType, verify


def _graph():
    """f(x, s; w) = (x.sum(), s + x, w * 2): a loss-like scalar, a state `s` (argument 1)
    and a param `w` that a caller feeds back (results 1 and 2)."""
    g = Graph("f", [TensorType((2, 3), "f32"), TensorType((2, 3), "f32")])
    b = Builder(g.body)
    w = b.create("ember.param", [], {"id": "w", "path": "layer.w"},
                 result_types=[TensorType((2, 3), "f32")]).result
    two = b.op("ember.constant", value=np.array(2, np.float32))
    b.create("func.return", [b.op("ember.reduce_sum", g.args[0], axes=[0, 1], keepdims=False),
                             b.op("ember.add", g.args[1], g.args[0]), b.op("ember.mul", w, two)])
    return cpu.Executable(verify(g), use_cache=False)


def _start(run, x):
    """Two general calls: the turns are bound after the first."""
    s, w = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    _, s, w = run([x, s], [w])
    return s, w


def test_a_scratch_result_is_one_buffer_the_bound_calls_share():
    """`call` writes a scratch result into one buffer of its own on every call (no pool
    entry); `__call__` hands out copies of it, which stay as they were."""
    exe = _graph()
    run = exe.feedback({1: 1, 2: "w"}, scratch=(0,))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s, w = _start(run, x)
    scratch, kept = None, []
    for i in range(6):
        x[0, 0] = i
        if i % 2:
            loss, s, w = run([x, s], [w])
            kept.append((loss, float(loss)))
        else:
            turn = run.turn
            assert turn.fed == (s, w)
            loss, s, w = run.call(turn, [x], ())  # the fed input (s) left out at the end
            assert scratch is None or loss is scratch
            scratch = loss
        assert float(loss) == x.sum()
        np.testing.assert_array_equal(w, np.full((2, 3), 2.0 ** (i + 2), np.float32))
    assert all(float(loss) == value and loss is not scratch for loss, value in kept)
    assert exe.native_calls == 7


@pytest.fixture(params=[True, False], ids=["native guard", "python checks"])
def native(request, monkeypatch):
    """Whether bound calls check in the entry (guard.py) or, as where the guard cannot read
    this interpreter's objects, in Python."""
    if request.param and not guard.native():
        pytest.skip("this interpreter's objects are not laid out as the guard reads them")
    monkeypatch.setattr(guard, "native", lambda: request.param)
    return request.param


def test_a_bound_call_runs_only_on_the_next_turn_with_what_it_writes_free(native):
    """`call` returns None, running nothing, for a turn that is not the next call's (kept
    from before) or while a caller holds an array the turn would write."""
    exe = _graph()
    run = exe.feedback({1: 1, 2: "w"}, scratch=(0,))
    x = np.ones((2, 3), np.float32)
    s, w = _start(run, x)  # what the turn after the next one writes
    old = run.turn
    assert run.call(old, [x], ()) is not None
    assert run.call(old, [x], ()) is None  # stale: the next turn is the other one
    del old
    assert run.call(run.turn, [x], ()) is None  # s and w are held here
    del s, w
    assert run.call(run.turn, [x], ()) is not None
    assert exe.native_calls == 3


def _reshape(a):
    a.shape = a.shape[::-1]


def _retype(a):
    a.dtype = np.int32  # the same bytes read as another dtype of the same size


def _restride(a):
    a.strides = a.strides[::-1]  # its data read as the transpose


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # NumPy 2.4+: setting strides
@pytest.mark.parametrize("change", [_reshape, _retype, _restride])
def test_a_bound_call_refuses_a_fed_array_laid_out_anew_in_place(native, change):
    """numpy lets a caller set an array's shape, dtype or strides in place: a bound call
    fed such an array runs nothing (the general call converts it or says what is
    wrong)."""
    exe = _graph()
    run = exe.feedback({1: 1, 2: "w"}, scratch=(0,))
    x = np.ones((2, 3), np.float32)
    s, w = _start(run, x)
    assert (run.turn.guard is not None) == native
    calls = exe.native_calls
    for fed in (s, w):
        layout = fed.shape, fed.dtype, fed.strides
        change(fed)
        assert run.call(run.turn, [x], ()) is None
        fed.dtype, fed.shape, fed.strides = layout[1], layout[0], layout[2]
    assert exe.native_calls == calls
    _, s, w = run.call(run.turn, [x], ())
    np.testing.assert_array_equal(w, np.full((2, 3), 4.0, np.float32))


def test_an_input_resized_in_place_is_read_where_its_data_went(native):
    """`x.resize(..., refcheck=False)` moves x's data and frees the old buffer: the next
    call reads the new one (the Python checks bound x by identity, and read freed
    memory)."""
    exe = _graph()
    run = exe.feedback({1: 1, 2: "w"}, scratch=(0,))
    x = np.ones((2, 3), np.float32)
    _start(run, x)
    run.call(run.turn, [x], ())
    x.resize((1 << 20,), refcheck=False)
    squatter = np.ones(6, np.float32)  # takes the freed block, so x's data lands elsewhere
    x.resize((2, 3), refcheck=False)
    x[...] = 5.0
    loss, *_ = run.call(run.turn, [x], ())
    assert float(loss) == 30.0 and squatter.sum() == 6


def test_a_compiled_function_reads_an_input_resized_in_place():
    g = Graph("f", [TensorType((1000,), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.neg", g.args[0])])
    exe = cpu.Executable(verify(g), use_cache=False)
    x = np.ones(1000, np.float32)
    exe([x])
    x.resize((1 << 20,), refcheck=False)
    squatter = np.ones(1000, np.float32)  # noqa: F841  (takes the freed block)
    x.resize((1000,), refcheck=False)
    x[...] = 5.0
    np.testing.assert_array_equal(exe([x])[0], np.full(1000, -5.0, np.float32))


def test_the_entry_binds_the_tensor_inputs_it_checks():
    """With the guard, a bound call's entry reads each tensor input's data from the object
    it is given, after checking it is a C-contiguous ndarray of the dtype and shape bound:
    anything else runs nothing (the general call converts or refuses it)."""
    if not guard.native():
        pytest.skip("this interpreter's objects are not laid out as the guard reads them")
    exe = _graph()
    run = exe.feedback({1: 1, 2: "w"}, scratch=(0,))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    _start(run, x)
    calls = exe.native_calls
    wide = np.zeros((2, 6), np.float32)
    wide[:, ::2] = x
    for other in (x.astype(np.float64), x.reshape(3, 2), wide[:, ::2], x.tolist(),
                  np.asfortranarray(x), np.zeros((2, 3, 1), np.float32)):
        assert run.call(run.turn, [other], ()) is None
    assert run.call(run.turn, [], ()) is None  # never the last call's input, maybe gone
    assert exe.native_calls == calls
    for k in range(3):  # another array each call, read where it is
        y = x + k
        loss, *_ = run.call(run.turn, [y], ())
        assert float(loss) == y.sum()


def test_the_entry_copies_the_float_scalars_it_is_given(native):
    """A bound call takes its float scalars (an lr) as Python or numpy floats, rounded to
    the graph's dtype as numpy rounds them; with the guard, another type runs nothing (the
    general call converts it), and inputs given as a tuple are read too."""
    g = Graph("f", [TensorType((2, 3), "f32"), TensorType((), "f32"),
                    TensorType((2, 3), "f32")])
    b = Builder(g.body)
    w = b.create("ember.param", [], {"id": "w", "path": "layer.w"},
                 result_types=[TensorType((2, 3), "f32")]).result
    two = b.op("ember.constant", value=np.array(2, np.float32))
    loss = b.op("ember.mul", b.op("ember.reduce_sum", g.args[0], axes=[0, 1],
                                  keepdims=False), g.args[1])
    b.create("func.return", [loss, b.op("ember.add", g.args[2], g.args[0]),
                             b.op("ember.mul", w, two)])
    exe = cpu.Executable(verify(g), use_cache=False)
    run = exe.feedback({1: 2, 2: "w"}, scratch=(0,))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    run([x, 3, np.zeros((2, 3), np.float32)], [np.ones((2, 3), np.float32)])
    total = np.float32(x.sum())
    for a in (0.1, 1e-3, 2.5, np.float64(0.3), np.float32(0.7), np.float32(1e-40)):
        loss = run.call(run.turn, [x, a], ())[0]  # (the other results not held)
        assert loss == total * np.float32(a)
    loss = run.call(run.turn, (x, 0.5), ())[0]
    assert loss == total * 0.5
    calls = exe.native_calls
    for a in (3, np.int64(2), np.array(0.5, np.float32), np.float16(0.25)):
        result = run.call(run.turn, [x, a], ())
        assert (result is None) == native
        if native:
            s, w = run.turn.fed
            result = run([x, a, s], [w])  # the general call converts it
            del s, w
        assert result[0] == total * np.float32(a)
        del result
    assert exe.native_calls == calls + 4
