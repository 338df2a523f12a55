"""The rows an Executable (executable.py) binds and returns on every call, one per slot,
built once when it is compiled: its tensor inputs and params (`Operand`), its scalar inputs
(`ScalarInput`) and its results (`Result`). Frozen dataclasses with slots: the general call
and the bound call (bound.py) read them on every call, and CPython reads a slot faster than
it unpacks or indexes a tuple (and a NamedTuple's fields slower than either)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ....ir import TensorType


@dataclass(frozen=True, slots=True)
class Operand:
    """An input (an argument, by position) or a param (by id) the caller binds per call."""

    slot: int  # its buffer's slot in the table
    key: Any  # its position among the inputs (an int), or the param's id (a str)
    dtype: np.dtype
    shape: tuple[int, ...]
    type: TensorType
    what: str  # what errors call it: `input 0 (x)`, `param fc1.weight (id ...)`


@dataclass(frozen=True, slots=True)
class ScalarInput:
    """A 0-d input (a learning rate, a step count), copied into a buffer of its own."""

    key: Any  # its position among the inputs (an int)
    buffer: Any  # written through `.value`: a ctypes scalar over the buffer, or a _Scalar
    takes: tuple[type, ...]  # the Python and numpy types written as they are
    dtype: np.dtype
    type: TensorType
    what: str


@dataclass(frozen=True, slots=True)
class Result:
    """One of the graph's results."""

    slot: int
    shape: tuple[int, ...] | None  # the shape to view the slot as, None: its own
    own: bool  # handed over as it is (a fresh buffer, the first time it is returned)


__all__ = ["Operand", "Result", "ScalarInput"]
