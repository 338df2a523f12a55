"""The tools a `// RUN:` line names, as commands on this machine: shared by conftest.py
(the files run under pytest) and lit.cfg.py (the same files run under lit)."""

from __future__ import annotations

import shlex
import shutil
import sys


def ember_opt() -> str:
    """`ember opt` as this Python runs it (the venv's ember, whatever is on PATH)."""
    return f"{shlex.quote(sys.executable)} -m ember opt"


def filecheck() -> str:
    """The filecheck package's executable, or its module where no script is on PATH."""
    exe = shutil.which("filecheck")
    return shlex.quote(exe) if exe else f"{shlex.quote(sys.executable)} -m filecheck"
