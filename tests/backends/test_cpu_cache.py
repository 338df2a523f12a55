"""The compile cache and the GEMM table on disk, damaged: a bad entry is caught before LLVM
maps it (mapped unchecked, an empty, cut or garbage object segfaulted, a zeroed one
aborted, a flipped code byte was SIGILL or wrong numbers, another graph's entry wrong
numbers), deleted, recompiled and rewritten; a bad table is ignored. Never a crash, never
a wrong number."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import llvmlite.binding as llvm
import numpy as np
import pytest

from ember.backends import cpu
from ember.backends.cpu.gemm import cost
from ember.backends.cpu.machine import cache
from ember.backends.cpu.machine.jit import JitModule
from ember.backends.input_checks import InputCheckError
from ember.ir import Builder, Graph, TensorType, verify

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from ember.backends import cpu
    from test_cpu_cache import graph

    g = graph(sys.argv[1])
    exe = cpu.Executable(g)
    out = exe([np.arange(12, dtype=np.float32).reshape(4, 3)])[0]
    print(json.dumps({"cached": exe.cached, "key": exe.cache_key, "out": out.tolist()}))
""")
X = np.arange(12, dtype=np.float32).reshape(4, 3)
WANT = {"product": ((X + X) * X).tolist(), "sum": (X + X).tolist()}


def graph(kind: str) -> Graph:
    """(x + x) * x, or just x + x: same signature and plan, different code."""
    g = Graph("f", [TensorType((4, 3), "f32")], ["x"])
    b = Builder(g.body)
    (x,) = g.args
    y = b.op("ember.add", x, x)
    if kind == "product":
        y = b.op("ember.mul", y, x)
    b.create("func.return", [y])
    return verify(g)


def run(cache_dir, kind: str) -> dict:
    """Compile and run `graph(kind)` in a fresh process on the cache in `cache_dir`."""
    env = {**os.environ, "EMBER_CACHE_DIR": str(cache_dir), "EMBER_CACHE": "1",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, kind], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["out"] == WANT[kind]
    return result


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A cache holding valid entries for both graphs, and their keys."""
    d = tmp_path_factory.mktemp("pristine")
    keys = {kind: run(d, kind)["key"] for kind in WANT}
    assert {p.name for p in (d / "cpu").iterdir()} == {f"{k}.o" for k in keys.values()}
    return d, keys


def code_offset(obj: bytes) -> int:
    """Where the machine code starts in an object file (its first non-empty code section)."""
    code = next(s.data() for s in llvm.ObjectFileRef.from_data(obj).sections()
                if s.is_text() and s.size())
    return obj.index(code)


def flip(data: bytes, i: int) -> bytes:
    b = bytearray(data)
    b[i] ^= 0x40
    return bytes(b)


HEADER = cache._HEADER.size
# each takes (the entry, the other graph's entry) and returns what lands on disk
DAMAGES = {
    "empty": lambda e, other: b"",
    "truncated to half": lambda e, other: e[:len(e) // 2],
    "zero-filled": lambda e, other: bytes(len(e)),
    "a flipped code byte": lambda e, other: flip(e, HEADER + code_offset(e[HEADER:])),
    "a flipped header byte": lambda e, other: flip(e, 12),  # the payload length
    "stored under another key": lambda e, other: other,
    "garbage": lambda e, other: np.random.default_rng(0).bytes(len(e)),
    "bare object code (no header)": lambda e, other: e[HEADER:],
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_entry_is_recompiled_and_rewritten_by_the_next_process(
        damage, pristine, tmp_path, monkeypatch):
    src, keys = pristine
    shutil.copytree(src, tmp_path / "c")
    entry, other = (tmp_path / "c" / "cpu" / f"{keys[k]}.o" for k in ("product", "sum"))
    entry.write_bytes(DAMAGES[damage](entry.read_bytes(), other.read_bytes()))
    result = run(tmp_path / "c", "product")  # exit 0 and (x + x) * x, checked in run
    assert result["key"] == keys["product"]  # it did meet the damaged entry
    assert not result["cached"]
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "c"))
    assert cache.load(keys["product"]) is not None and cache.load(keys["sum"]) is not None
    assert not [p for p in (tmp_path / "c").rglob("*") if p.name.endswith(".tmp")]


POOL_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    from ember.backends import cpu
    from ember.backends.cpu.machine import jit
    from test_cpu_cache import graph

    out = cpu.Executable(graph("sum"))([np.arange(12, dtype=np.float32).reshape(4, 3)])[0]
    print(json.dumps({"compiled": "optimize" in jit._pool.timings, "out": out.tolist()}))
""")


def pool_compiled(cache_dir) -> bool:
    """Whether a fresh process on `cache_dir` compiled the thread pool (else loaded it)."""
    env = {**os.environ, "EMBER_CACHE_DIR": str(cache_dir), "EMBER_CACHE": "1",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", POOL_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["out"] == WANT["sum"]
    return result["compiled"]


def test_the_thread_pool_is_compiled_once_and_a_damaged_one_again(tmp_path):
    """Every process loads the pool's code: from the cache after the first (its LLVM run
    took 0.03 s of each cached load), and a damaged entry is compiled and rewritten."""
    assert pool_compiled(tmp_path)
    (entry,) = (tmp_path / "cpu-pool").iterdir()
    intact = entry.read_bytes()
    assert not pool_compiled(tmp_path)
    for damage in ("truncated to half", "a flipped code byte"):  # every kind: next test
        entry.write_bytes(DAMAGES[damage](intact, b""))
        assert pool_compiled(tmp_path), damage
        assert not pool_compiled(tmp_path), damage  # rewritten whole


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    return tmp_path / "cpu"


def test_every_cut_and_every_flipped_byte_is_caught_and_deleted(cache_dir):
    obj = bytes(range(256)) * 3
    cache.store("k", obj)
    assert cache.load("k") == obj
    entry = (cache_dir / "k.o").read_bytes()
    damaged = [entry[:n] for n in range(len(entry))] + \
        [flip(entry, i) for i in range(len(entry))] + [entry + b"\0"]
    for data in damaged:
        (cache_dir / "k.o").write_bytes(data)
        assert cache.load("k") is None
        assert not (cache_dir / "k.o").exists()
    cache.store("k", obj)
    os.rename(cache_dir / "k.o", cache_dir / "other.o")
    assert cache.load("other") is None


def test_a_failed_write_leaves_no_temp_file_and_keeps_the_old_entry(cache_dir, monkeypatch):
    cache.store("k", b"old code")

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", disk_full)
        cache.store("k", b"new code")  # no error: a full disk only costs a compile
        cache.store("fresh", b"code")
    assert [p.name for p in cache_dir.iterdir()] == ["k.o"]
    assert cache.load("k") == b"old code"


def test_an_entry_llvm_refuses_is_a_miss_and_deleted(cache_dir, monkeypatch):
    obj = cpu.Executable(graph("sum"), use_cache=False)._jit.object_code
    cache.store("k", obj)
    jit = cache.load_jit("k")
    assert isinstance(jit, JitModule) and jit.object_code == obj

    def refuse(obj):
        raise RuntimeError("LLVM ERROR: bad object")

    monkeypatch.setattr(JitModule, "from_object", refuse)
    assert cache.load_jit("k") is None
    assert not (cache_dir / "k.o").exists()


@pytest.fixture
def table_file(tmp_path, monkeypatch):
    """Where the GEMM table lives (in tmp_path) of the CPU and thread count DEFAULT_TABLE
    was measured on, which this host pretends to be (on any other, a missing table is
    measured: test_cpu_gemm_choice.py); read afresh around each test."""
    name, threads = cost.DEFAULT_HOST
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_NUM_THREADS", str(threads))
    for module in (cost, cache):
        monkeypatch.setattr(module, "host_cpu", lambda: name)
    cost.load_table.cache_clear()
    yield cost.table_path(name, threads)
    cost.load_table.cache_clear()


@pytest.mark.parametrize("text", [
    b"", b"garbage", b'{"64x64x64": [100.0, 9', b"\xff\xfe\x00", b"[1, 2]", b"{}",
    b'{"64x64x64": [1]}', b'{"64x64": [1, 2]}', b'{"axbxc": [1, 2]}', b'{"64x64x64": "12"}',
    b'{"64x64x64": [NaN, 1]}', b'{"64x64x64": [true, 1]}', b'{"0x64x64": [1, 2]}',
    b"[" * 100_000])
def test_a_damaged_gemm_table_is_ignored_with_a_warning(table_file, text):
    table_file.write_bytes(text)
    with pytest.warns(UserWarning, match="ignoring the damaged GEMM table"):
        exe = cpu.Executable(graph("product"))
    assert exe([X])[0].tolist() == WANT["product"]
    assert cost.load_table(*cost.DEFAULT_HOST) is cost.DEFAULT_TABLE


def test_a_rewritten_gemm_table_is_read(table_file):
    table_file.write_text(json.dumps({"64x64x64": [100, 20.5], "8x8x8": [1.5, 2.0]}))
    assert cost.load_table(*cost.DEFAULT_HOST) == {
        (64, 64, 64): (100.0, 20.5), (8, 8, 8): (1.5, 2.0)}


def test_an_entry_llvm_refuses_is_recompiled_by_the_executable(cache_dir, monkeypatch):
    cpu.Executable(graph("product"))
    (entry,) = cache_dir.iterdir()
    with monkeypatch.context() as m:
        m.setattr(JitModule, "from_object", lambda obj: (_ for _ in ()).throw(RuntimeError("no")))
        exe = cpu.Executable(graph("product"))
    assert not exe.cached and exe([X])[0].tolist() == WANT["product"]
    assert cache.load(entry.stem) is not None and cpu.Executable(graph("product")).cached


def test_input_checks_are_part_of_the_key(cache_dir):
    """The same graph with and without compiled label checks is two entries: a cached entry
    without the checks would let bad labels through (and lacks the status word)."""

    def negate(checked: bool) -> Graph:
        g = Graph("labels", [TensorType((4,), "i64")], ["y"])
        Builder(g.body).create("func.return", [Builder(g.body).op("ember.neg", g.args[0])])
        if checked:
            g.attributes["ember.label_args"] = [[0, 3]]
        return verify(g)

    assert not cpu.Executable(negate(False)).cached
    exe = cpu.Executable(negate(True))
    assert not exe.cached and exe.checks_inputs
    with pytest.raises(InputCheckError):
        exe([np.array([0, 1, 7, 2])])


def test_a_killed_writer_s_old_temp_file_is_swept_by_the_next_store(cache_dir):
    cache_dir.mkdir(parents=True)
    old, fresh = cache_dir / ".a.o.x1.tmp", cache_dir / ".b.o.x2.tmp"
    for t in (old, fresh):
        t.write_bytes(b"half an object")
    hour_ago = time.time() - cache.ORPHAN_SECONDS - 1
    os.utime(old, (hour_ago, hour_ago))
    cache.store("k", b"object code")
    assert not old.exists() and fresh.exists()  # a fresh one may be another writer's
