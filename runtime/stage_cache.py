"""The stage cache: a pipeline's final graph on disk, keyed by the traced graph it came from.

A second process that traces the same model re-ran every IR pass (~0.5 s for a 4-layer
GPT training step) before the backend's object cache hit. With this cache it parses the
final graph instead, and the backend then hits its object cache on that graph.

Key: the traced graph as Stages prints it ("traced"), with param ids numbered in order of
appearance (they are random unless seeded, and the passes only carry them along), the
pipeline, the backend's name and ember's own source files that shape pass output (ir/,
passes/, runtime/pipeline.py). Value: the final text, with the same numbering; the
loading process puts its own ids back. The unfused text (for locating errors) is not
stored: it carries source locations, which the key leaves out, so Stages rebuilds it from
this trace when an error asks for it. Entries are sealed (cache_store.py): a damaged one
is deleted and the passes run again. `EMBER_CACHE=0` disables it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from ..cache_store import Store, source_hash
from ..files import cache_enabled
from ..ir import Graph
from ..ir.parser import parse
from .pipeline import Stages

_STORE = Store("stages", ".mlir", b"emberstg", 1)
_HOLE = re.compile("\0([0-9]+)\0")  # a numbered param id; NUL never appears in printed IR


@functools.cache
def _source_hash() -> str:
    root = Path(__file__).parent.parent
    return source_hash(root / "ir", root / "passes", root / "runtime" / "pipeline.py")


def param_ids(graph: Graph) -> list[str]:
    """The graph's param ids, each once, in order of appearance."""
    return list(dict.fromkeys(op.attributes["id"] for op in graph.ops
                              if op.name == "ember.param"))


def number_ids(text: str, ids: list[str]) -> str | None:
    """`text` with each param id (quoted, or as the `id:` of a role such as `id:exp_avg`)
    replaced by its number; None where an id is left anywhere else, which a restored text
    would get wrong."""
    if not ids:
        return text
    number = {pid: i for i, pid in enumerate(ids)}
    found = re.compile('(?<=")(' + "|".join(map(re.escape, ids)) + ')(?=[":])')
    numbered = found.sub(lambda m: f"\0{number[m[1]]}\0", text)
    return None if any(pid in numbered for pid in ids) else numbered


def restore_ids(text: str, ids: list[str]) -> str:
    return _HOLE.sub(lambda m: ids[int(m[1])], text)


def key(traced: str, pipeline: Iterable[str], backend: str) -> str:
    h = hashlib.sha256()
    for part in (traced, ",".join(pipeline), backend, _source_hash()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def stages(graph: Graph, pipeline: list[str], backend: str) -> Stages:
    """`Stages(graph, pipeline)`, or on a hit the cached final graph with the passes
    deferred; a miss stores its final graph for the next process."""
    if not cache_enabled():
        return Stages(graph, pipeline)
    start = time.perf_counter()
    ids = param_ids(graph)
    traced = number_ids(str(graph), ids)
    if traced is None:
        return Stages(graph, pipeline)
    k = key(traced, pipeline, backend)
    found = _STORE.load(k)
    if found is not None:
        try:
            final = parse(restore_ids(found.decode(), ids))
        except (UnicodeDecodeError, ValueError):  # intact but unreadable: never trusted
            _STORE.discard(k)
        else:
            if os.environ.get("EMBER_PASS_TIMING"):
                print(f"@{graph.name} IR passes: skipped, stage cache hit "
                      f"({time.perf_counter() - start:.4f} s)", file=sys.stderr)
            return Stages(graph, pipeline, final=final)
    done = Stages(graph, pipeline)
    numbered = number_ids(str(done.graph), ids)
    if numbered is not None:
        _STORE.store(k, numbered.encode())
    return done
