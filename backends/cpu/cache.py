"""The compile cache: object code on disk, keyed by what it was compiled from.

Key: the graph as ember prints it (after every pass; param ids, paths and init strings
blanked, since they never reach the code), the host (triple, CPU name, features), the
llvmlite version, the BLAS library, the backend's own source files and the options
(threads, GEMM choice, unrolling). A hit skips LLVM entirely: plan the buffers (cheap),
map the object file, done. Files are written atomically (temp file, then rename), so
concurrent processes never read half a file; past MAX_ENTRIES files the oldest quarter
goes. `EMBER_CACHE=0` disables the cache, `EMBER_CACHE_DIR` moves it (~/.cache/ember).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
from pathlib import Path

from .cost import cache_dir

_PARAM = re.compile(r'"ember\.param"\(\) \{[^}]*\}')
_FUNC_ATTRS = re.compile(r"^(\s*func\.func .*?) attributes \{.*\} \{$", re.M)


def enabled() -> bool:
    return os.environ.get("EMBER_CACHE", "1") != "0"


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
    from .cost import load_table
    from .jit import host_cpu

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


def load(k: str) -> bytes | None:
    try:
        return path(k).read_bytes()
    except OSError:
        return None


MAX_ENTRIES = 2000  # beyond this, the least recently written quarter is removed


def store(k: str, obj: bytes) -> None:
    p = path(k)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(obj)
        os.replace(tmp, p)
        entries = list(p.parent.glob("*.o"))
        if len(entries) > MAX_ENTRIES:
            entries.sort(key=lambda e: e.stat().st_mtime)
            for e in entries[:len(entries) // 4]:
                e.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only or full disk only costs the next process a compile
