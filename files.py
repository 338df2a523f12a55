"""Durable file writes, shared by every layer that saves something (records, training
checkpoints, the compile cache, the data cache): a leaf module that imports nothing of ember."""

from __future__ import annotations

import os
import tempfile


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
