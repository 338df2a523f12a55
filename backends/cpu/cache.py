"""The compile cache: object code on disk, keyed by what it was compiled from.

Key: the graph as ember prints it (after every pass; param ids, paths and init strings
blanked, since they never reach the code), the host (triple, CPU name, features), the
llvmlite version, the BLAS library, the backend's own source files and the options
(threads, GEMM choice, unrolling). A hit skips LLVM entirely: plan the buffers (cheap),
map the object file, done. LLVM trusts an object file completely (an empty or cut one
segfaults, a flipped code byte is SIGILL, a changed constant a wrong result), so each
entry starts with a header (magic, format version, payload length, sha256 of the payload
and of the key it was stored under) and `load` checks all of it before LLVM sees a byte:
a damaged entry is deleted and recompiled, never mapped. Entries are written with
`write_atomically` (fsync, rename), so neither a crash nor a concurrent reader sees half
a file; past MAX_ENTRIES files the oldest quarter goes. `EMBER_CACHE=0` disables the
cache, `EMBER_CACHE_DIR` moves it (~/.cache/ember).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import struct
import time
from pathlib import Path

from ...files import cache_dir, write_atomically
from .cost import load_table
from .host import host_cpu
from .jit import JitModule

_PARAM = re.compile(r'"ember\.param"\(\) \{[^}]*\}')
_FUNC_ATTRS = re.compile(r"^(\s*func\.func .*?) attributes \{.*\} \{$", re.M)


@functools.cache
def _source_hash() -> str:
    h = hashlib.sha256()
    here = Path(__file__).parent
    for p in sorted(here.glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def options(threads: int) -> str:
    """The settings that change the generated code besides the graph."""
    env = {k: os.environ.get(k, "") for k in ("EMBER_GEMM", "EMBER_BLAS", "EMBER_LLVM_UNROLL")}
    table = sorted(load_table(host_cpu(), threads).items())
    return f"threads={threads} {sorted(env.items())} table={table}"


def canonical(text: str) -> str:
    text = _PARAM.sub('"ember.param"()', text)
    return _FUNC_ATTRS.sub(r"\1 {", text)


def key(graph_text: str, fingerprint: str, options: str) -> str:
    h = hashlib.sha256()
    for part in (canonical(graph_text), fingerprint, options, _source_hash()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def path(k: str) -> Path:
    return cache_dir() / "cpu" / f"{k}.o"


# magic, format version, payload length, sha256 of the payload, sha256 of the key
_HEADER = struct.Struct("<8sIQ32s32s")
_MAGIC, _VERSION = b"emberobj", 1


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _pack(k: str, obj: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, _VERSION, len(obj), _sha256(obj), _sha256(k.encode())) + obj


def _unpack(k: str, entry: bytes) -> bytes | None:
    """The object code in `entry` if every header field matches it and `k`, else None."""
    if len(entry) < _HEADER.size:
        return None
    magic, version, length, digest, key_digest = _HEADER.unpack_from(entry)
    obj = entry[_HEADER.size:]
    intact = (magic, version, length, key_digest) == (
        _MAGIC, _VERSION, len(obj), _sha256(k.encode()))
    return obj if intact and digest == _sha256(obj) else None


def discard(k: str) -> None:
    try:
        path(k).unlink(missing_ok=True)
    except OSError:
        pass  # a read-only cache: the next process checks (and rejects) it again


def load(k: str) -> bytes | None:
    """The object code stored under `k`; None when there is none or the entry is damaged
    (then it is deleted, so the recompiled code replaces it)."""
    try:
        entry = path(k).read_bytes()
    except OSError:
        return None
    obj = _unpack(k, entry)
    if obj is None:
        discard(k)
    return obj


def load_jit(k: str) -> JitModule | None:
    """`load(k)` mapped by LLVM; None (entry deleted) where LLVM refuses an intact entry too."""
    obj = load(k)
    if obj is None:
        return None
    try:
        return JitModule.from_object(obj)
    except (RuntimeError, ValueError):  # llvmlite's errors and its NULL-pointer check
        discard(k)
        return None


MAX_ENTRIES = 2000  # beyond this, the least recently written quarter is removed


def store(k: str, obj: bytes) -> None:
    p = path(k)
    try:
        write_atomically(str(p), _pack(k, obj))
        entries = list(p.parent.glob("*.o"))
        if len(entries) > MAX_ENTRIES:
            entries.sort(key=lambda e: e.stat().st_mtime)
            for e in entries[:len(entries) // 4]:
                e.unlink(missing_ok=True)
        _sweep_orphans(p.parent)
    except OSError:
        pass  # a read-only or full disk only costs the next process a compile


ORPHAN_SECONDS = 3600  # a temp file this old was left by a writer that was killed


def _sweep_orphans(directory: Path) -> None:
    """Remove the temp files of writers killed mid-write (write_atomically removes its own
    on any error it sees, but not on SIGKILL)."""
    old = time.time() - ORPHAN_SECONDS
    for t in directory.glob(".*.tmp"):
        with contextlib.suppress(OSError):
            if t.stat().st_mtime < old:
                t.unlink()
