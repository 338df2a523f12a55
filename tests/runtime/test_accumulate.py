"""Gradient accumulation, `compile_train_step(..., accumulate=k)`: k micro-batches, one
update, equal to one step on their concatenation (runtime/accumulate.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from small_models import MeanPool

import ember as em
from ember import nn, optim
from ember.runtime.checkpoint import CheckpointError
from ember.runtime.distributed import Communicator

RTOL = 1e-6  # f32, relative to the largest element of each param


def mlp(seed: int = 0) -> nn.Module:
    em.seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh(),
                         nn.Linear(16, 4))


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 8)).astype(np.float32), rng.integers(0, 4, n)


def assert_close(a: nn.Module, b: nn.Module, rtol: float = RTOL) -> None:
    for (path, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        want, got = p.val(), q.val()
        err = np.abs(want - got).max() / max(np.abs(want).max(), 1e-30)
        assert err <= rtol, f"{path}: relative error {err}"


def loss(logits, y):
    return nn.functional.cross_entropy(logits, y)


@pytest.mark.parametrize("make_opt", [lambda: optim.AdamW(lr=1e-2, weight_decay=0.05),
                                      lambda: optim.SGD(lr=0.1, momentum=0.9)],
                         ids=["adamw", "sgd-momentum"])
def test_accumulate_4_of_16_equals_batches_of_64(make_opt):
    big, small = mlp(), mlp()
    ref = em.compile_train_step(big, loss, make_opt())
    step = em.compile_train_step(small, loss, make_opt(), accumulate=4)
    x, y = data(640)
    for i in range(10):
        xs, ys = x[64 * i:64 * (i + 1)], y[64 * i:64 * (i + 1)]
        ref(xs, ys)
        losses = []
        for j in range(4):
            before = [p.val() for p in small.parameters()]
            losses.append(step(xs[16 * j:16 * (j + 1)], ys[16 * j:16 * (j + 1)]))
            if j < 3:  # no update yet: the params are the very arrays they were
                assert all(p.val() is v for p, v in zip(small.parameters(), before))
                assert step.pending == j + 1
        assert step.pending == 0
        assert step.optimizer.step_count == ref.optimizer.step_count == i + 1
        assert_close(big, small)
        assert all(np.isfinite(v) for v in losses)
    assert step.compiles == 2  # the accumulate and the update graph
    assert "accumulate=4" in repr(step)


def test_each_call_returns_its_own_micro_batch_loss():
    a, b = mlp(), mlp()
    plain = em.compile_grad(a, loss)  # the loss at the params the micro-batch saw
    step = em.compile_train_step(b, loss, optim.SGD(lr=0.1), accumulate=3)
    x, y = data(48)
    for j in range(3):
        xs, ys = x[16 * j:16 * (j + 1)], y[16 * j:16 * (j + 1)]
        got = step(xs, ys)
        plain(xs, ys)
        assert got == pytest.approx(plain.loss, rel=1e-6)


def test_accumulate_1_is_the_plain_step_bit_for_bit():
    a, b = mlp(), mlp()
    plain = em.compile_train_step(a, loss, optim.AdamW(lr=1e-2))
    one = em.compile_train_step(b, loss, optim.AdamW(lr=1e-2), accumulate=1)
    assert one.accumulator is None and one.accumulate == 1 and one.pending == 0
    x, y = data(160)
    for i in range(10):
        assert plain(x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)]) == \
            one(x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)])
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(p.val(), q.val())
    assert plain.ir() == one.ir() and repr(plain) == repr(one)


def test_the_lr_schedule_advances_once_per_update():
    schedule = optim.StepLR(0.1, step_size=2, gamma=0.5)
    big, small = mlp(), mlp()
    ref = em.compile_train_step(big, loss, optim.SGD(lr=schedule, momentum=0.9))
    step = em.compile_train_step(small, loss, optim.SGD(lr=schedule, momentum=0.9),
                                 accumulate=2)
    x, y = data(32 * 6)
    lrs = []
    for i in range(6):
        xs, ys = x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)]
        ref(xs, ys)
        for j in range(2):
            lrs.append(step.optimizer.lr)
            step(xs[16 * j:16 * (j + 1)], ys[16 * j:16 * (j + 1)])
        assert step.optimizer.step_count == i + 1
        assert_close(big, small)
    # two micro-batches per update, two updates per lr: the lr halves every 4 calls
    assert lrs == [0.1] * 4 + [0.05] * 4 + [0.025] * 4


def test_under_the_recompute_strategy():
    strategy = next(s for s in ("balanced", "all", "min-cut")
                    if s in em.recompute_strategies())
    big, small = mlp(), mlp()
    ref = em.compile_train_step(big, loss, optim.AdamW(lr=1e-2))
    step = em.compile_train_step(small, loss, optim.AdamW(lr=1e-2), accumulate=2,
                                 recompute=strategy)
    x, y = data(32 * 4)
    for i in range(4):
        ref(x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)])
        step(x[32 * i:32 * i + 16], y[32 * i:32 * i + 16])
        step(x[32 * i + 16:32 * (i + 1)], y[32 * i + 16:32 * (i + 1)])
        assert_close(big, small)
    assert "recompute" in step.stages and "accumulate-grads" in step.stages


def test_interpreter_backend_too():
    big, small = mlp(), mlp()
    ref = em.compile_train_step(big, loss, optim.SGD(lr=0.1, momentum=0.9),
                                backend="interpreter")
    step = em.compile_train_step(small, loss, optim.SGD(lr=0.1, momentum=0.9),
                                 backend="interpreter", accumulate=2)
    x, y = data(64)
    for i in range(2):
        ref(x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)])
        step(x[32 * i:32 * i + 16], y[32 * i:32 * i + 16])
        step(x[32 * i + 16:32 * (i + 1)], y[32 * i + 16:32 * (i + 1)])
    assert_close(big, small)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError),
                                        (True, TypeError), (False, TypeError),
                                        ("4", TypeError), (None, TypeError)])
def test_bad_accumulate_is_a_usage_error_before_compiling(bad, error):
    model = mlp()
    with pytest.raises(error, match="accumulate"):
        em.compile_train_step(model, loss, optim.SGD(lr=0.1), accumulate=bad)
    with pytest.raises(error, match="accumulate"):  # with symbolic dims and DP too
        em.compile_train_step(model, loss, optim.SGD(lr=0.1), accumulate=bad,
                              dynamic_dims={0: {0: "B"}})
    assert not any(p.is_initialized for p in model.parameters())


def test_numpy_int_is_accepted():
    step = em.compile_train_step(mlp(), loss, optim.SGD(lr=0.1), accumulate=np.int64(3))
    assert step.accumulate == 3 and type(step.accumulate) is int


def test_dynamic_dims_weight_each_micro_batch_one_kth():
    """Micro-batches of lengths 5, 11, 7, 9 padded to buckets: the same params as exact
    shapes, each micro-batch weighted 1/k whatever its length."""
    em.seed(1)
    padded = MeanPool()
    em.seed(1)
    exact = MeanPool()
    step = em.compile_train_step(padded, loss, optim.AdamW(lr=1e-2), accumulate=2,
                                 dynamic_dims={0: {1: "T"}})
    ref = em.compile_train_step(exact, loss, optim.AdamW(lr=1e-2), accumulate=2)
    labels = np.array([0, 2, 1])
    for t in (5, 11, 7, 9):
        x = np.random.default_rng(t).standard_normal((3, t, 6)).astype(np.float32)
        assert step(x, labels) == pytest.approx(ref(x, labels), rel=1e-5)
    assert step.pending == 0 and step.optimizer.step_count == 2
    assert_close(exact, padded, rtol=1e-5)
    # and 1/k each: one update from grads of the two micro-batches, averaged by hand
    em.seed(1)
    by_hand = MeanPool()
    grad = em.compile_grad(by_hand, loss)
    opt = optim.AdamW(lr=1e-2)
    for pair in ((5, 11), (7, 9)):
        total = None
        for t in pair:
            x = np.random.default_rng(t).standard_normal((3, t, 6)).astype(np.float32)
            g = grad(x, labels)
            total = {k: v / 2 for k, v in g.items()} if total is None else \
                {k: total[k] + v / 2 for k, v in g.items()}
        opt.step(by_hand, em.GradientsParams(total))
    assert_close(by_hand, padded, rtol=1e-5)


def test_checkpoint_mid_accumulation_keeps_the_buffers(tmp_path):
    x, y = data(16 * 8)
    a = mlp()
    step = em.compile_train_step(a, loss, optim.AdamW(lr=1e-2), accumulate=4)
    for j in range(6):  # one update, then 2 of 4 pending
        step(x[16 * j:16 * (j + 1)], y[16 * j:16 * (j + 1)])
    assert step.pending == 2
    path = step.save_checkpoint(str(tmp_path / "mid.safetensors"))
    for j in range(6, 8):
        step(x[16 * j:16 * (j + 1)], y[16 * j:16 * (j + 1)])
    b = mlp(seed=5)  # other values: all come from the file
    resumed = em.compile_train_step(b, loss, optim.AdamW(lr=1e-2), accumulate=4)
    resumed.load_checkpoint(path)
    assert resumed.pending == 2 and resumed.optimizer.step_count == 1
    for j in range(6, 8):
        resumed(x[16 * j:16 * (j + 1)], y[16 * j:16 * (j + 1)])
    assert resumed.pending == 0 and resumed.optimizer.step_count == 2
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(p.val(), q.val())
    # another k, or no accumulation, is refused, and nothing changes
    for k in (1, 2):
        other = em.compile_train_step(mlp(seed=6), loss, optim.AdamW(lr=1e-2), accumulate=k)
        with pytest.raises(CheckpointError, match="accumulate=4"):
            other.load_checkpoint(path)
        assert other.pending == 0 and other.optimizer.step_count == 0
    # saved right after an update: no accumulation in the file, loads into any k
    clean = step.save_checkpoint(str(tmp_path / "clean.safetensors"))
    one = em.compile_train_step(mlp(seed=7), loss, optim.AdamW(lr=1e-2))
    one.load_checkpoint(clean)
    assert one.optimizer.step_count == 2


def test_a_refused_call_leaves_the_buffers_as_they_were():
    step = em.compile_train_step(mlp(), loss, optim.SGD(lr=0.1), accumulate=3)
    x, y = data(32)
    step(x[:16], y[:16])
    kept = dict(step.accumulator.grads)
    bad = x[16:].copy()
    bad[0, 0] = np.nan
    with pytest.raises((FloatingPointError, ValueError)):
        step(bad, y[16:])
    assert step.pending == 1
    assert all(step.accumulator.grads[k] is v for k, v in kept.items())


# -- data parallel, two ranks as two threads of one process ---------------------------------

class _Group:
    def __init__(self, world: int):
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots: list = [None] * world


class ThreadComm(Communicator):
    """A communicator between threads: each collective's inputs are summed in rank order."""

    backend = "threads"

    def __init__(self, group: _Group, rank: int, world: int):
        self.group, self.rank, self.world_size = group, rank, world
        self.reduced: list[tuple[str, int]] = []  # (dtype, size) of each allreduce

    def allreduce_(self, array):
        self.reduced.append((str(array.dtype), array.size))
        g = self.group
        g.slots[self.rank] = np.array(array)
        g.barrier.wait()
        total = g.slots[0].copy()
        for other in g.slots[1:]:
            total += other
        g.barrier.wait()
        array[...] = total
        return array

    def broadcast_(self, array, root=0):
        g = self.group
        g.slots[self.rank] = np.array(array)
        g.barrier.wait()
        array[...] = g.slots[root]
        g.barrier.wait()
        return array

    def barrier(self):
        self.group.barrier.wait()


def test_data_parallel_two_ranks_reduce_once_per_update(tmp_path):
    """2 ranks x 2 micro-batches of 8 = one step on 32 rows; the gradients are reduced at
    every 2nd call only."""
    x, y = data(32 * 4)
    big = mlp()
    ref = em.compile_train_step(big, loss, optim.SGD(lr=0.1, momentum=0.9))
    for i in range(4):
        ref(x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)])
    group, results, errors = _Group(2), {}, []

    def rank(r: int) -> None:
        try:
            comm = ThreadComm(group, r, 2)
            model = mlp(seed=r)  # rank 0's params are broadcast
            step = em.compile_train_step(model, loss, optim.SGD(lr=0.1, momentum=0.9),
                                         data_parallel=comm, accumulate=2)
            for i in range(4):
                for j in range(2):  # rank r, micro-batch j: rows [32i + 16j + 8r, +8)
                    lo = 32 * i + 16 * j + 8 * r
                    step(x[lo:lo + 8], y[lo:lo + 8])
                    assert step.pending == (j + 1) % 2
                if i == 1:  # mid-accumulation save: the ranks' summed buffers
                    step(x[:8], y[:8])
                    step.save_checkpoint(str(tmp_path / "dp.safetensors"))
                    step.restore_accumulated(0, {})  # drop it again
            results[r] = (model, comm.reduced, step.optimizer.step_count)
        except BaseException as e:  # noqa: BLE001  (reported by the test's thread)
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    (m0, reduced0, steps0), (m1, _, _) = results[0], results[1]
    assert steps0 == 4
    for p, q in zip(m0.parameters(), m1.parameters()):
        np.testing.assert_array_equal(p.val(), q.val())
    assert_close(big, m0)
    grads = [r for r in reduced0 if r[0] == "float32"]
    n_params = sum(p.val().size for p in m0.parameters())
    # one flat buffer (loss + grads) per update, then the saved buffers (one per param)
    big_reductions = [r for r in grads if r[1] >= n_params]
    assert len(big_reductions) == 4
    from ember.runtime.checkpoint import read

    tensors, doc = read(str(tmp_path / "dp.safetensors"))
    assert doc["accumulation"]["micro_batches"] == 1
    assert any(name.startswith("accum/") for name in tensors)


def test_ember_train_accumulate_saves_mid_cycle_and_resumes(tmp_path, capsys):
    """digits has 44 batches of 32 an epoch: with --accumulate 3 the first epoch ends with
    2 micro-batches pending, which the checkpoint keeps; resuming with another K is
    refused."""
    from ember.__main__ import main

    ck = str(tmp_path / "run.safetensors")
    args = ["train", "--no-progress", "--accumulate", "3", "--schedule", "cosine"]
    assert main([*args, "--epochs", "1", "--save", ck]) == 0
    out = capsys.readouterr().out
    assert "3 micro-batches per update" in out
    from ember.runtime.checkpoint import read

    _, doc = read(ck)
    assert doc["extra"]["epoch"] == 1
    assert doc["optimizer_step"] == 14 and doc["accumulation"]["micro_batches"] == 2
    assert main([*args, "--epochs", "2", "--resume", ck]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert main(["train", "--no-progress", "--accumulate", "2", "--epochs", "2",
                 "--resume", ck]) == 1
    assert "accumulate=3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--accumulate", "0"])


def test_requires_grad_changed_mid_accumulation_is_refused():
    model = mlp()
    step = em.compile_train_step(model, loss, optim.SGD(lr=0.1), accumulate=2)
    x, y = data(32)
    step(x[:16], y[:16])
    first = next(iter(model.parameters()))
    first.requires_grad = False
    with pytest.raises(ValueError, match="requires_grad changed mid-accumulation"):
        step(x[16:], y[16:])
    first.requires_grad = True
    step(x[16:], y[16:])  # the cycle completes as if nothing happened
    assert step.pending == 0 and step.optimizer.step_count == 1
