"""Data-parallel overlap: each bucket of gradients (passes/bucket_grads.py) starts its
reduction as soon as the backward has finished it, with its gradients already in place."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.runtime.data_parallel import DataParallelStep
from ember.runtime.distributed import Communicator


class Recording(Communicator):
    """One process; keeps what each started reduction saw when it started."""

    def __init__(self):
        self.started: list[tuple[np.ndarray, np.ndarray]] = []  # (the span, its contents)

    def allreduce_start(self, array):
        self.started.append((array, array.copy()))
        return super().allreduce_start(array)


def gpt_like() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 64),
                         nn.GELU(), nn.Linear(64, 8))


@pytest.fixture
def small_buckets(monkeypatch):
    monkeypatch.setattr(DataParallelStep, "bucket_bytes", 4096)


def test_each_bucket_starts_once_with_its_final_gradients(small_buckets):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 16)).astype(np.float32), rng.integers(0, 8, 32)
    comm = Recording()
    em.seed(0)
    step = em.compile_train_step(gpt_like(), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 data_parallel=comm)
    step(x, y)
    buckets = step.graph.attributes["ember.grad_buckets"]
    assert len(buckets) > 3
    assert len(comm.started) == len(buckets)  # one dtype: one span each
    for span, seen in comm.started:  # the spans still hold what the gradients are
        np.testing.assert_array_equal(span, seen)
    starts = [span.ctypes.data for span, _ in comm.started]
    assert starts == sorted(starts)  # bucket 0 first: laid out, and started, in order


def test_buckets_reduced_during_the_run_equal_the_fused_step(small_buckets):
    """The same losses and params as the one fused training step."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((32, 16)).astype(np.float32), rng.integers(0, 8, 32)
    finals = []
    for dp in (False, Recording()):
        em.seed(0)
        m = gpt_like()
        step = em.compile_train_step(m, nn.functional.cross_entropy, optim.AdamW(lr=1e-2),
                                     data_parallel=dp)
        losses = [step(x, y) for _ in range(3)]
        finals.append((losses, [p.val().copy() for p in m.parameters()]))
    (l0, p0), (l1, p1) = finals
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    for a, b in zip(p0, p1):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
