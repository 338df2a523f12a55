"""Sealed cache entries on disk, shared by the compile caches (object code, final graphs): a
leaf module that imports nothing of ember but `files`.

An entry is only a copy of something ember can rebuild, so a damaged one is a miss, never
trusted: each starts with a header (magic, format version, payload length, sha256 of the
payload and of the key it was stored under) and `load` checks all of it before the payload
is used; a damaged entry is deleted, so the rebuilt one replaces it. Entries are written
with `write_atomically` (fsync, rename), so neither a crash nor a concurrent reader sees
half a file; past `max_entries` files the oldest quarter goes, and temp files of writers
killed mid-write are swept. A read-only or full disk only costs the next process a rebuild.

`vouching` is how one cache speaks for a graph to the next: the stage cache names the final
graph it hands a backend by its entry's digest, so the CPU backend keys its object code by
that instead of printing the graph again, and skips verifying what the passes verified.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .files import cache_dir, write_atomically

# magic, format version, payload length, sha256 of the payload, sha256 of the key
HEADER = struct.Struct("<8sIQ32s32s")
ORPHAN_SECONDS = 3600  # a temp file this old was left by a writer that was killed


def source_hash(*roots: Path) -> str:
    """sha256 of the Python files under `roots` (folders, searched recursively, or files):
    part of a key wherever that code shapes what is cached."""
    h = hashlib.sha256()
    for root in roots:
        for p in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


@dataclass(frozen=True)
class Store:
    """The entries in `cache_dir()/folder`, one file `<key><suffix>` each."""

    folder: str
    suffix: str
    magic: bytes  # 8 bytes
    version: int
    max_entries: int = 2000  # beyond this, the least recently written quarter is removed

    def path(self, k: str) -> Path:
        return cache_dir() / self.folder / f"{k}{self.suffix}"

    def pack(self, k: str, payload: bytes) -> bytes:
        return HEADER.pack(self.magic, self.version, len(payload), _sha256(payload),
                           _sha256(k.encode())) + payload

    def unpack(self, k: str, entry: bytes) -> bytes | None:
        """The payload of `entry` if every header field matches it and `k`, else None."""
        if len(entry) < HEADER.size:
            return None
        magic, version, length, digest, key_digest = HEADER.unpack_from(entry)
        payload = entry[HEADER.size:]
        intact = (magic, version, length, key_digest) == (
            self.magic, self.version, len(payload), _sha256(k.encode()))
        return payload if intact and digest == _sha256(payload) else None

    def discard(self, k: str) -> None:
        try:
            self.path(k).unlink(missing_ok=True)
        except OSError:
            pass  # a read-only cache: the next process checks (and rejects) it again

    def load(self, k: str) -> bytes | None:
        """The payload stored under `k`; None when there is none or the entry is damaged
        (then it is deleted, so the rebuilt payload replaces it)."""
        try:
            entry = self.path(k).read_bytes()
        except OSError:
            return None
        payload = self.unpack(k, entry)
        if payload is None:
            self.discard(k)
        return payload

    def store(self, k: str, payload: bytes) -> None:
        p = self.path(k)
        try:
            write_atomically(str(p), self.pack(k, payload))
            entries = list(p.parent.glob(f"*{self.suffix}"))
            if len(entries) > self.max_entries:
                entries.sort(key=lambda e: e.stat().st_mtime)
                for e in entries[:len(entries) // 4]:
                    e.unlink(missing_ok=True)
            _sweep_orphans(p.parent)
        except OSError:
            pass  # a read-only or full disk only costs the next process a rebuild


def _sweep_orphans(directory: Path) -> None:
    """Remove the temp files of writers killed mid-write (write_atomically removes its own
    on any error it sees, but not on SIGKILL)."""
    old = time.time() - ORPHAN_SECONDS
    for t in directory.glob(".*.tmp"):
        with contextlib.suppress(OSError):
            if t.stat().st_mtime < old:
                t.unlink()


_VOUCHED: dict[int, tuple[object, str]] = {}  # id(graph) -> (the graph, its digest)


@contextlib.contextmanager
def vouching(graph: object, digest: str | None) -> Iterator[None]:
    """While the block runs, `vouched(graph)` is `digest` (None: nothing is vouched for).
    Only for a graph that verifies, under a digest that changes with anything in it that can
    change its compiled code; scoped to a block, so a graph changed later never carries it."""
    if digest is None:
        yield
        return
    _VOUCHED[id(graph)] = (graph, digest)
    try:
        yield
    finally:
        _VOUCHED.pop(id(graph), None)


def vouched(graph: object) -> str | None:
    """The digest `vouching` holds for this very graph object, else None."""
    held = _VOUCHED.get(id(graph))
    return held[1] if held is not None and held[0] is graph else None
