"""The storage of one buffer of a compiled graph, as both code generators plan it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import TensorType


@dataclass(eq=False)
class Slot:
    """kind: "arg" (key: input index), "param" (key: param id), "const" (value: its data),
    "temp" (an op result), "scratch" (an op's working memory) or "packed" (a param's copy
    laid out as a kernel reads it; key: the param's slot). Temps and scratch sit at
    byte `offset` of the arena, except temps the graph returns (`offset` None: fresh per
    call)."""

    kind: str
    type: TensorType
    key: int | str | None = None
    path: str = ""
    value: np.ndarray | None = None
    offset: int | None = None
