"""The stage cache: a pipeline's final graph on disk, keyed by the traced graph it came from.

A second process that traces the same model re-ran every IR pass (~0.9 s for a 16-layer
GPT training step) before the backend's object cache hit. With this cache it reads the
final graph back instead, and the backend then loads its object code for that graph.

Key: the traced graph as printed (printed once; no source locations), with param ids
numbered in order of appearance (they are random unless seeded, and the passes only carry
them along), the pipeline, the backend's name, ember's version, numpy's (constant folding)
and ember's own source files that shape pass output (ir/, passes/, runtime/pipeline.py,
this file). Value: the final graph packed (ir/pack.py: JSON that reads back ~5x faster
than the MLIR text parses), its strings numbered the same way; the loading process puts
its own ids back. The unfused text (for locating errors) is not stored: it carries source
locations, which the key leaves out, so Stages rebuilds it from this trace when an error
asks for it. Entries are sealed (cache_store.py): a damaged one is deleted and the passes
run again, and so is an intact one that does not unpack. `EMBER_CACHE=0` disables it.

The final graph is handed to the backend vouched for (`cache_store.vouching`) by the
entry's digest (sha256 of its payload), on a hit as on the miss that stored it: the passes
verified that graph, and the digest names it, so the CPU backend neither verifies nor
prints it again to find its object code. A 16-layer step's cached load: ~0.15 s (0.7 s
when the hit parsed MLIR text and the backend verified and printed it again).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..cache_store import Store, source_hash
from ..files import cache_enabled
from ..ir import Graph
from ..ir import pack as packing
from ..ir.printer import print_graph
from ..settings import PASS_TIMING
from .pipeline import Stages

_STORE = Store("stages", ".json", b"emberstg", 2)
_HOLE = re.compile("\0([0-9]+)\0")  # a numbered param id; NUL never appears in printed IR
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')  # an MLIR string literal, escapes and all


@functools.cache
def _source_hash() -> str:
    root = Path(__file__).parent.parent
    files = source_hash(root / "ir", root / "passes", root / "runtime" / "pipeline.py",
                        Path(__file__))
    # the package's __version__, read where `import ember` (a cycle from here) left it
    version = getattr(sys.modules.get(__name__.split(".")[0]), "__version__", None)
    return f"{files} ember {version} numpy {np.__version__}"


def param_ids(graph: Graph) -> list[str]:
    """The graph's param ids, each once, in order of appearance."""
    return list(dict.fromkeys(op.attributes["id"] for op in graph.ops
                              if op.name == "ember.param"))


def numbering(ids: list[str], check: bool = False) -> Callable[[str], str | None]:
    """A function that replaces, in MLIR text, each string literal that is a param id, or
    starts with one and a `:` (a role such as `id:exp_avg`), by the id's number. `check`:
    it gives None for a text where an id is left anywhere else, which a restored text would
    get wrong, or that holds a NUL, which would read back as a number."""
    number = {pid: f"\0{i}\0" for i, pid in enumerate(ids)}

    def one(m: re.Match) -> str:
        head, colon, tail = m[1].partition(":")
        n = number.get(head)
        return m[0] if n is None else f'"{n}{colon}{tail}"'

    def numbered(text: str) -> str | None:
        if check and "\0" in text:
            return None
        out = _STRING.sub(one, text) if ids else text
        return None if check and any(pid in out for pid in ids) else out

    return numbered


def number_ids(text: str, ids: list[str]) -> str | None:
    """`text` with its param ids numbered; None where that cannot be undone (`numbering`)."""
    return numbering(ids, check=True)(text)


def restore_ids(text: str, ids: list[str]) -> str:
    """`text` with each numbered param id replaced by `ids`' (IndexError: a number past
    them)."""
    return _HOLE.sub(lambda m: ids[int(m[1])], text)


def key(traced: str, pipeline: Iterable[str], backend: str) -> str:
    h = hashlib.sha256()
    for part in (traced, ",".join(pipeline), backend, _source_hash()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def _strings(packed: dict[str, Any], edit: Callable[[str], str | None]) -> dict[str, Any] | None:
    """`packed` with `edit` applied to every string it holds; None where `edit` gave None."""
    out = dict(packed)
    for table in packing.TABLES:
        out[table] = [edit(s) for s in packed[table]]
        if None in out[table]:
            return None
    return out


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a graph is built and compiled: a graph is one big
    cycle (values <-> uses), so each collection that allocations trigger walks all of it
    (PassManager.run pauses it for the passes too); what they leave is collected after."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def stages(graph: Graph, pipeline: list[str], backend: str) -> Stages:
    """`Stages(graph, pipeline)`, or on a hit the cached final graph with the passes
    deferred; a miss stores its final graph for the next process. `digest` is set where
    the final graph may be vouched for to the backend."""
    if not cache_enabled():
        return Stages(graph, pipeline)
    start = time.perf_counter()
    ids = param_ids(graph)
    # the key needs no check that every id got its number: one left in is in the key as
    # it is, so only the same id there hits; the stored graph is checked (number_ids)
    k = key(numbering(ids)(print_graph(graph)) or "", pipeline, backend)  # never None here
    found = _STORE.load(k)
    if found is not None:
        try:
            with collector_paused():
                packed = _strings(packing.loads(found), lambda s: restore_ids(s, ids))
                final = packing.unpack(packed)
        except (ValueError, TypeError, IndexError, KeyError):  # intact but unreadable
            _STORE.discard(k)  # never trusted: the passes run again and store it anew
        else:
            if PASS_TIMING.get():
                print(f"@{graph.name} IR passes: skipped, stage cache hit "
                      f"({time.perf_counter() - start:.4f} s)", file=sys.stderr)
            done = Stages(graph, pipeline, final=final)
            done.digest = _digest(found, pipeline)
            return done
    done = Stages(graph, pipeline)
    try:
        numbered = _strings(packing.pack(done.graph), numbering(ids, check=True))
    except (KeyError, TypeError, ValueError):  # a graph the printer could not print either
        numbered = None
    if numbered is not None:  # else one the numbering cannot undo: not stored
        payload = packing.dumps(numbered)
        _STORE.store(k, payload)
        done.digest = _digest(payload, pipeline)
    return done


def _digest(payload: bytes, pipeline: list[str]) -> str | None:
    """What names a stored final graph to the backend; None for an empty pipeline, whose
    final graph is the traced one, which no pass verified."""
    return hashlib.sha256(payload).hexdigest() if pipeline else None
