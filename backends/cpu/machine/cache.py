"""The compile cache: object code on disk, keyed by what it was compiled from.

Key: the graph as ember prints it (after every pass; param ids, paths and init strings
blanked, since they never reach the code), the host (triple, CPU name, features), the
llvmlite version, the BLAS library, the backend's own source files and the options
(threads, the GEMM cost table, the caches' sizes, and every switch settings.py declares
as changing the generated code: GEMM choice, BLAS, unrolling, ...). A hit skips LLVM
entirely: plan the buffers (cheap), map the object file, done. A graph the stage cache
vouches for (cache_store.vouching) is keyed by the digest it names it by instead of its
text, which then need not be printed
(`key_of_digest`; the digest covers the param ids numbered, and changes with anything in the
graph). LLVM trusts an object file completely (an empty or cut one
segfaults, a flipped code byte is SIGILL, a changed constant a wrong result), so entries
are sealed (cache_store.py: header, checksums, atomic writes) and checked before LLVM sees
a byte: a damaged entry is deleted and recompiled, never mapped. `EMBER_CACHE=0` disables
the cache, `EMBER_CACHE_DIR` moves it (~/.cache/ember).
"""
from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

from ....cache_store import HEADER as _HEADER
from ....cache_store import ORPHAN_SECONDS, source_hash
from ....settings import code_values
from ..gemm.cost import load_table
from .host import host_caches, host_cpu
from .jit import OBJECTS, JitModule

_PARAM = re.compile(r'"ember\.param"\(\) \{[^}]*\}')
_FUNC_ATTRS = re.compile(r"^(\s*func\.func .*?) attributes \{.*\} \{$", re.M)
_STORE = OBJECTS
path, load, store, discard = _STORE.path, _STORE.load, _STORE.store, _STORE.discard


@functools.cache
def _source_hash() -> str:
    return source_hash(Path(__file__).parents[1])


def options(threads: int) -> str:
    """The settings that change the generated code besides the graph."""
    env = code_values()  # every switch declared to change the generated code
    table = sorted(load_table(host_cpu(), threads).items())
    # the own GEMM's blocks (and so its scratch layout) follow the caches
    return f"threads={threads} {sorted(env.items())} table={table} caches={host_caches()}"


def canonical(text: str) -> str:
    text = _PARAM.sub('"ember.param"()', text)
    return _FUNC_ATTRS.sub(r"\1 {", text)


def key(graph_text: str, fingerprint: str, options: str) -> str:
    return _key(canonical(graph_text), fingerprint, options)


def key_of_digest(digest: str, fingerprint: str, options: str) -> str:
    """The key of a graph known by a digest of its content (a stage cache entry's): never
    one of `key`'s, whose canonical texts start with `module {`."""
    return _key(f"digest {digest}", fingerprint, options)


def _key(graph: str, fingerprint: str, options: str) -> str:
    h = hashlib.sha256()
    for part in (graph, fingerprint, options, _source_hash()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


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


__all__ = ["ORPHAN_SECONDS", "_HEADER", "canonical", "discard", "key", "key_of_digest", "load",
           "load_jit", "options", "path", "store"]
