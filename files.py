"""Durable file writes and the cache directory, shared by every layer that saves something
(records, training checkpoints, the compile cache, the GEMM table, the data cache): a leaf
module that imports nothing of ember."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """Where ember keeps what it can rebuild: EMBER_CACHE_DIR, else ~/.cache/ember (or
    $XDG_CACHE_HOME/ember)."""
    d = os.environ.get("EMBER_CACHE_DIR")
    if d:
        return Path(d)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ember"


def cache_enabled() -> bool:
    """False under `EMBER_CACHE=0`: compiled code and data copies are then neither read
    nor written (the GEMM table, written only by the tuner, is still read)."""
    return os.environ.get("EMBER_CACHE", "1") != "0"


def write_atomically(path: str, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it over `path`:
    a crash at any point leaves either the old file or the new one, never a torn one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
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
