"""Compiled steps called from several Python threads at once: the same bits as called one
after the other (a call that cannot have the thread pool runs the same chunks on its own
thread), and one step shared by threads stays whole (its calls are serialized)."""

from __future__ import annotations

import threading

import numpy as np

import ember as em
from ember import nn, optim
from ember.runtime.data import digits

F = nn.functional


class Mlp(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, hidden), nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def batches(n: int, size: int = 512):
    data = digits()
    for i in range(n):
        j = (i * 64) % (len(data.x_train) - size)
        yield data.x_train[j:j + size], data.y_train[j:j + size]


def two_steps():
    """Two models whose kernels are large enough to split across the pool's threads (the
    bias gradients' column sums among them: each thread sums its rows on its own)."""
    em.seed(1)
    a = em.compile_train_step(Mlp(2048), F.cross_entropy, optim.SGD(lr=0.05, momentum=0.9),
                              backend="cpu")
    em.seed(2)
    b = em.compile_train_step(Mlp(1024), F.cross_entropy, optim.Adam(lr=1e-3), backend="cpu")
    return a, b


def train(step, losses: list, steps: int = 40) -> None:
    losses.extend(step(x, y) for x, y in batches(steps))


def in_threads(*jobs) -> None:
    errors = []

    def run(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 (reported in the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=run, args=job, daemon=True) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a training thread hung"
    if errors:
        raise errors[0]


def test_two_models_trained_at_once_equal_one_after_the_other_bitwise():
    alone = [[], []]
    for step, losses in zip(two_steps(), alone):
        train(step, losses)
    together = [[], []]
    in_threads(*((train, step, losses) for step, losses in zip(two_steps(), together)))
    assert together == alone


def test_one_step_called_from_three_threads_counts_every_call():
    em.seed(0)
    model = Mlp(256)
    step = em.compile_train_step(model, F.cross_entropy, optim.Adam(lr=1e-3), backend="cpu")
    losses: list = []
    in_threads(*((train, step, losses, 30) for _ in range(3)))
    assert len(losses) == 90 and np.isfinite(losses).all()
    assert all(np.isfinite(p.val()).all() for p in model.parameters())
    assert step.optimizer.step_count == 90
