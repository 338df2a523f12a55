"""The process-wide thread pool behind parallel loops: exact results however the chunks
are shared, from several Python threads at once, and in a forked child (whose workers did
not survive the fork, so its loops run on the calling thread)."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest

from ember.backends import cpu
from ember.backends.cpu import threads as cpu_threads
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
    pid = os.fork()
    if pid == 0:  # the child: a hang here would fail the test by timeout in waitpid below
        try:
            check(exe, x)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    for _ in range(600):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        threading.Event().wait(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the forked child hung in a parallel loop")
    assert os.waitstatus_to_exitcode(status) == 0
