"""Constant folding: the ops `canonicalize` may evaluate at compile time, and how.

Only ops where folding pays are listed (elementwise arithmetic, casts, shape ops and
reductions); anything else stays in the graph for a backend to run. The table is
`ir.semantics` (shared with the interpreter: a pass never imports a backend).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.precision import widened
from ..ir.semantics import SIMPLE_OPS, Folder

FOLDERS: dict[str, Folder] = SIMPLE_OPS


def fold(name: str, attrs: dict[str, Any], *values: np.ndarray) -> np.ndarray | None:
    """The value of op `name` on constant operands, or None when it is not folded."""
    fn = FOLDERS.get(name)
    if fn is None:
        return None
    with np.errstate(all="ignore"):  # bf16 and f16 in f32; `constant` rounds the result
        return np.asarray(fn(attrs, *map(widened, values)))
