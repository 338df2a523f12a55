"""Initializers (`em.init`): how a lazy Param computes its first value, with burn's formulas.

Each is a frozen dataclass called as `init(shape, rng, fan_in, fan_out) -> np.ndarray`
(float64; the Param casts to its dtype). `str(init)` is the text of the `init` attribute
of `ember.param`, e.g. `kaiming_uniform(gain=0.5773502691896258, fan_out_only=False)`.
Fans are given by the layer that owns the Param (Linear: fan_in=d_in, fan_out=d_out);
`check` raises when a fan-based initializer has none, when the Param is created.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True)
class Initializer:
    def __call__(self, shape, rng: np.random.Generator, fan_in=None, fan_out=None) -> np.ndarray:
        raise NotImplementedError

    def check(self, shape, fan_in, fan_out) -> None:
        """Raise ValueError if this initializer cannot fill `shape` with these fans."""

    @property
    def name(self) -> str:
        return str(self)

    def __str__(self) -> str:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", type(self).__name__).lower()
        return f"{snake}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in fields(self))})"


@dataclass(frozen=True)
class Constant(Initializer):
    value: float

    def __call__(self, shape, rng, fan_in=None, fan_out=None):
        return np.full(shape, self.value, dtype=np.float64)


@dataclass(frozen=True)
class Ones(Initializer):
    def __call__(self, shape, rng, fan_in=None, fan_out=None):
        return np.ones(shape)


@dataclass(frozen=True)
class Zeros(Initializer):
    def __call__(self, shape, rng, fan_in=None, fan_out=None):
        return np.zeros(shape)


@dataclass(frozen=True)
class Uniform(Initializer):
    lo: float
    hi: float

    def __call__(self, shape, rng, fan_in=None, fan_out=None):
        return rng.uniform(self.lo, self.hi, size=shape)


@dataclass(frozen=True)
class Normal(Initializer):
    mean: float
    std: float

    def __call__(self, shape, rng, fan_in=None, fan_out=None):
        return rng.normal(self.mean, self.std, size=shape)


@dataclass(frozen=True)
class _Kaiming(Initializer):
    gain: float = math.sqrt(2.0)
    fan_out_only: bool = False

    def check(self, shape, fan_in, fan_out):
        which, fan = ("fan_out", fan_out) if self.fan_out_only else ("fan_in", fan_in)
        if fan is None:
            raise ValueError(f"{type(self).__name__} needs {which}: the layer must give it "
                             "(Param(..., fan_in=..., fan_out=...))")

    def scale(self, fan_in, fan_out) -> float:
        """gain / sqrt(fan): the std of KaimingNormal."""
        self.check(None, fan_in, fan_out)
        return self.gain / math.sqrt(fan_out if self.fan_out_only else fan_in)


@dataclass(frozen=True)
class KaimingUniform(_Kaiming):
    def __call__(self, shape, rng, fan_in=None, fan_out=None):
        bound = math.sqrt(3.0) * self.scale(fan_in, fan_out)
        return rng.uniform(-bound, bound, size=shape)


@dataclass(frozen=True)
class KaimingNormal(_Kaiming):
    def __call__(self, shape, rng, fan_in=None, fan_out=None):
        return rng.normal(0.0, self.scale(fan_in, fan_out), size=shape)


@dataclass(frozen=True)
class _Xavier(Initializer):
    gain: float = 1.0

    def check(self, shape, fan_in, fan_out):
        if fan_in is None or fan_out is None:
            raise ValueError(f"{type(self).__name__} needs fan_in and fan_out: the layer must "
                             "give both (Param(..., fan_in=..., fan_out=...))")

    def scale(self, fan_in, fan_out) -> float:
        """gain * sqrt(2 / (fan_in + fan_out)): the std of XavierNormal."""
        self.check(None, fan_in, fan_out)
        return self.gain * math.sqrt(2.0 / (fan_in + fan_out))


@dataclass(frozen=True)
class XavierUniform(_Xavier):
    def __call__(self, shape, rng, fan_in=None, fan_out=None):
        bound = math.sqrt(3.0) * self.scale(fan_in, fan_out)
        return rng.uniform(-bound, bound, size=shape)


@dataclass(frozen=True)
class XavierNormal(_Xavier):
    def __call__(self, shape, rng, fan_in=None, fan_out=None):
        return rng.normal(0.0, self.scale(fan_in, fan_out), size=shape)


@dataclass(frozen=True)
class Orthogonal(Initializer):
    """A (semi-)orthogonal matrix over [shape[0], prod(shape[1:])], times `gain`."""

    gain: float = 1.0

    def check(self, shape, fan_in, fan_out):
        if len(shape) < 2:
            raise ValueError(f"Orthogonal needs a shape of rank >= 2, got {list(shape)}")

    def __call__(self, shape, rng, fan_in=None, fan_out=None):
        self.check(shape, fan_in, fan_out)
        rows, cols = shape[0], math.prod(shape[1:])
        q, r = np.linalg.qr(rng.normal(size=(max(rows, cols), min(rows, cols))))
        q *= np.where(np.diag(r) < 0, -1.0, 1.0)  # a uniformly random orthogonal matrix
        return self.gain * (q if rows >= cols else q.T).reshape(shape)


__all__ = ["Initializer", "Constant", "Ones", "Zeros", "Uniform", "Normal", "KaimingUniform",
           "KaimingNormal", "XavierUniform", "XavierNormal", "Orthogonal"]
