"""Data-parallel overlap: each bucket of gradients (passes/bucket_grads.py) starts its
reduction as soon as the backward has finished it, with its gradients already in place:
an allreduce, or sharded (ZeRO-1) a reduce-scatter of the bucket's segments."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.runtime.data_parallel import DataParallelStep
from ember.runtime.distributed import Communicator, Pending


class Recording(Communicator):
    """One process; keeps what each started reduction saw when it started."""

    def __init__(self):
        self.started: list[tuple[np.ndarray, np.ndarray]] = []  # (the span, its contents)

    def allreduce_start(self, array):
        self.started.append((array, array.copy()))
        return super().allreduce_start(array)


class ShardRecording(Communicator):
    """Rank 0 of two, sharded: keeps what each started reduce-scatter saw (the other rank's
    sums aside: one step's schedule is what is checked, not its values)."""

    world_size = 2

    def __init__(self):
        self.started: list[tuple[np.ndarray, np.ndarray, list[int]]] = []

    def check_same(self, *args, **kwargs):
        pass  # there is no second rank to agree with

    def reduce_scatter_start(self, array, counts):
        self.started.append((array, array.copy(), list(counts)))
        return Pending(lambda: None)


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


def test_sharded_buckets_are_reduce_scattered_during_the_run(small_buckets):
    """ZeRO-1: each bucket is one reduce-scatter, begun with its final gradients, its span
    one segment per rank."""
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((32, 16)).astype(np.float32), rng.integers(0, 8, 32)
    comm = ShardRecording()
    em.seed(0)
    step = em.compile_train_step(gpt_like(), nn.functional.cross_entropy,
                                 optim.AdamW(lr=1e-2), data_parallel=comm,
                                 shard_optimizer=True)
    step(x, y)
    buckets = step.graph.attributes["ember.grad_buckets"]
    assert len(buckets) > 3
    assert len(comm.started) == len(buckets)
    for span, seen, counts in comm.started:
        np.testing.assert_array_equal(span, seen)
        assert len(counts) == 2 and sum(counts) == span.size
    assert any(counts[1] for _, _, counts in comm.started)  # rank 1 updates some params
    starts = [span.ctypes.data for span, _, _ in comm.started]
    assert starts == sorted(starts)
