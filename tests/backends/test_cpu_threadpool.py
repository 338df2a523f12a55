"""The process-wide thread pool behind parallel loops: exact results however the chunks
are shared, from several Python threads at once, and in a forked child (whose workers did
not survive the fork, so its loops run on the calling thread)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

from ember.backends import cpu
from ember.backends.cpu.parallel import outline as cpu_threads
from ember.ir import Builder, Graph, TensorType, verify
from ember.passes import PassManager, parse_pipeline


def parallel_exe(monkeypatch, threads: int = 3) -> cpu.Executable:
    """exp(x) + row sums of x over 257 rows, split into `threads` chunks."""
    monkeypatch.setattr(cpu_threads, "MIN_WORK", 64)
    g = Graph("f", [TensorType((257, 33), "f32")])
    b = Builder(g.body)
    x = g.args[0]
    b.create("func.return", [b.op("ember.exp", x),
                             b.op("ember.reduce_sum", x, axes=[1], keepdims=False)])
    exe = cpu.Executable(verify(PassManager(parse_pipeline("fuse")).run(g)), threads=threads,
                         use_cache=False)
    assert "ember_parallel_for" in exe.llvm_ir
    return exe


def expected(x):
    return np.exp(x), x.sum(1)


def check(exe, x):
    got = exe([x])
    for a, e in zip(got, expected(x)):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)  # row sums near 0


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_chunks_cover_the_loop_exactly_for_any_thread_count(monkeypatch, threads):
    exe = parallel_exe(monkeypatch, threads)
    rng = np.random.default_rng(threads)
    for _ in range(50):  # back to back, and after the workers had time to fall asleep
        check(exe, rng.standard_normal((257, 33)).astype(np.float32))
    threading.Event().wait(0.05)
    check(exe, rng.standard_normal((257, 33)).astype(np.float32))


def test_concurrent_calls_from_python_threads_are_exact(monkeypatch):
    """Two executables in two Python threads: one gets the pool, the other runs its loop
    on its own thread; neither waits on the other nor mixes up chunks."""
    exes = [parallel_exe(monkeypatch), parallel_exe(monkeypatch)]
    errors = []

    def work(exe, seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                check(exe, rng.standard_normal((257, 33)).astype(np.float32))
        except AssertionError as e:  # reported below, in the test's thread
            errors.append(e)

    ts = [threading.Thread(target=work, args=(e, i), daemon=True) for i, e in enumerate(exes)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts) and not errors


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="needs fork")
def test_a_forked_child_runs_its_loops_on_its_own_thread(monkeypatch):
    exe = parallel_exe(monkeypatch)
    x = np.random.default_rng(0).standard_normal((257, 33)).astype(np.float32)
    check(exe, x)  # the pool is running in the parent
    in_child(lambda: check(exe, x), "the forked child hung in a parallel loop")


def in_child(fn, hung: str, timeout: float = 30.0) -> None:
    """Run `fn` in a forked child; fail with `hung` if it has not exited after `timeout`
    seconds (the child is killed), or if `fn` raised there."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            fn()
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    deadline = time.monotonic() + timeout
    while not (done := os.waitpid(pid, os.WNOHANG))[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(hung)
        threading.Event().wait(0.02)
    assert os.waitstatus_to_exitcode(done[1]) == 0


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="needs fork")
def test_a_child_forked_during_a_call_on_another_thread_can_call(monkeypatch):
    """The child inherits the executable's lock as the calling thread held it, and that
    thread does not exist in the child: the child's first call must not wait for it.
    (Own GEMM only: a fork while OpenBLAS computes on another thread can hang in the
    parent, inside OpenBLAS's own pre-fork handler, 1 run in 6 here; nothing ember can
    change.)"""
    monkeypatch.setenv("EMBER_GEMM", "own")
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    g = Graph("f", [TensorType((256, 256), "f32")] * 2)
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.matmul", *g.args)])
    exe = cpu.Executable(verify(g), threads=2, use_cache=False)
    want = x @ w
    stop = threading.Event()

    def calls():
        while not stop.is_set():
            exe([x, w])

    t = threading.Thread(target=calls, daemon=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)  # from the check to the fork this thread keeps the GIL,
    t.start()  # which the other needs to release the lock: it is inside a call
    try:
        while not exe._lock.locked():
            threading.Event().wait(0.001)
        in_child(lambda: np.testing.assert_allclose(exe([x, w])[0], want, rtol=1e-4,
                                                    atol=1e-3),
                 "the forked child hung on the lock another thread held")
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        t.join(30)


def column_sum_exe(monkeypatch) -> cpu.Executable:
    """Column sums of x [4096, 64] (a bias gradient), the rows split across 2 threads that
    each sum their share into accumulators of their own, added after."""
    monkeypatch.setattr(cpu_threads, "MIN_WORK", 64)
    g = Graph("f", [TensorType((4096, 64), "f32")])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.reduce_sum", g.args[0], axes=[0], keepdims=False)])
    exe = cpu.Executable(verify(PassManager(parse_pipeline("fuse")).run(g)), threads=2,
                         use_cache=False)
    assert "ember_parallel_for" in exe.llvm_ir
    return exe


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="needs fork")
def test_a_loop_without_the_pool_runs_the_same_chunks_bit_for_bit(monkeypatch):
    """A call that cannot have the pool (here: a forked child, whose workers are gone; a
    concurrent call from another thread takes the same path) runs each chunk in turn, so
    each thread's share still sums into its own accumulators: the same bits. It ran the
    whole loop as one chunk, which added the other chunk's stale partial sums."""
    exe = column_sum_exe(monkeypatch)
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((4096, 64)).astype(np.float32) for _ in range(2))
    exe([y])  # leaves partial sums of y in the scratch
    want = exe([x])[0].copy()

    def same():
        assert np.array_equal(exe([x])[0], want)

    in_child(same, "the forked child hung in a parallel loop")
