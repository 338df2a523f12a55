"""Checks of layer configurations: a bad value fails at construction, naming itself."""

from __future__ import annotations

import math


def positive(name: str, value) -> int:
    """A positive integer (a size), else ValueError naming `name` and the value."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def pair(name: str, value, lo: int = 1) -> tuple[int, int]:
    """An int or a pair of ints >= lo, as a pair."""
    p = (value, value) if isinstance(value, int) else value
    ok = (isinstance(p, (tuple, list)) and len(p) == 2
          and all(isinstance(d, int) and not isinstance(d, bool) and d >= lo for d in p))
    if not ok:
        raise ValueError(f"{name} must be an integer >= {lo} or a pair of them, got {value!r}")
    return tuple(p)


def number(name: str, value, lo: float, hi: float, hi_open: bool = False) -> float:
    """A finite real in [lo, hi] (or [lo, hi) with `hi_open`)."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and lo <= value and (value < hi if hi_open else value <= hi))
    if not ok:
        raise ValueError(f"{name} must be a finite number in [{lo}, {hi}{')' if hi_open else ']'}"
                         f", got {value!r}")
    return float(value)


def divides(layer: str, name: str, value, of: str, whole: int) -> int:
    """A positive integer `value` that divides `whole` (heads of a width, groups of
    channels), else ValueError naming both."""
    positive(f"{layer} {name}", value)
    if whole % value:
        raise ValueError(f"{layer} {name}={value} must divide {of}={whole}")
    return value


def groups_divide(layer: str, groups, c_in: int, c_out: int) -> int:
    positive(f"{layer} groups", groups)
    if c_in % groups or c_out % groups:
        raise ValueError(f"{layer} groups={groups} must divide c_in={c_in} and c_out={c_out}")
    return groups
