"""Durable file writes and the cache directory, shared by every layer that saves something
(records, training checkpoints, the compile cache, the GEMM table, the data cache): a leaf
module that imports nothing of ember but its settings."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from .settings import CACHE, CACHE_DIR


def cache_dir() -> Path:
    """Where ember keeps what it can rebuild: EMBER_CACHE_DIR, else ~/.cache/ember (or
    $XDG_CACHE_HOME/ember)."""
    d = CACHE_DIR.get()
    if d is not None:
        return d
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ember"


def cache_enabled() -> bool:
    """False under `EMBER_CACHE=0`: compiled code and data copies are then neither read
    nor written (the GEMM table, written only by the tuner, is still read)."""
    return CACHE.get()


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it over `path`:
    a crash at any point leaves either the old file or the new one, never a torn one. A
    symlink is followed (the file it names is replaced, the link kept); a target that is
    not a regular file (a device such as /dev/null or /dev/stdout, a FIFO) is written in
    place, never replaced; a replaced file keeps its permissions, a new one gets the
    umask's (as open() gives)."""
    path = os.path.realpath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "wb") as f:
            f.write(data)
        return
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode) if st is not None else _new_mode())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def _new_mode() -> int:
    """The mode open() gives a new file: 0o666 less the process's umask, read from Linux's
    /proc (setting the umask to read it, elsewhere, changes it for every thread a moment)."""
    try:
        with open("/proc/self/status") as f:
            mask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o22)
        os.umask(mask)
    return 0o666 & ~mask


def read_limited(path: str, limit: int, what: str = "file") -> bytes:
    """The bytes of `path` ("-": standard input), read in chunks: ValueError as soon as
    they pass `limit` bytes (`ember opt /dev/zero` read until memory ran out)."""
    chunks, total = [], 0
    with contextlib.nullcontext(sys.stdin.buffer) if path == "-" else open(path, "rb") as f:
        while chunk := f.read(min(1 << 24, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise ValueError(f"the {what} is larger than {limit:,} bytes")
    return b"".join(chunks)
