"""Tensor and scalar types of the IR, printed as MLIR builtin types."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

DTYPES = ("f32", "f64", "f16", "bf16", "i64", "i32", "i1")
FLOAT_DTYPES = frozenset({"f32", "f64", "f16", "bf16"})
LOW_PRECISION = frozenset({"f16", "bf16"})  # computed in f32 (ir/precision.py)
MAX_BYTES = 2**63 - 1  # every backend addresses a tensor's bytes with int64 offsets

# numpy has no bf16: ml_dtypes' bfloat16 (what JAX uses) holds it
_NUMPY: dict[str, np.dtype] = {k: np.dtype(v) for k, v in (
    ("f32", np.float32), ("f64", np.float64), ("f16", np.float16), ("bf16", ml_dtypes.bfloat16),
    ("i64", np.int64), ("i32", np.int32), ("i1", np.bool_))}
_FROM_NUMPY = {v: k for k, v in _NUMPY.items()}
_BF16 = _NUMPY["bf16"]


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that holds values of an IR dtype."""
    return _NUMPY[dtype]


def dtype_of(array_dtype: DTypeLike) -> str:
    """The IR dtype of a numpy dtype (or anything np.dtype accepts)."""
    d = np.dtype(array_dtype)
    if d not in _FROM_NUMPY:
        raise TypeError(f"ember has no dtype for numpy {d}; use one of {', '.join(DTYPES)}")
    return _FROM_NUMPY[d]


def is_float(array_dtype: DTypeLike) -> bool:
    """Whether a numpy dtype holds floats: numpy's own, and bfloat16 (whose kind is 'V')."""
    d = np.dtype(array_dtype)
    return d.kind == "f" or d == _BF16


@dataclass(frozen=True)
class TensorType:
    """`tensor<4x8xf32>`; a scalar is `tensor<f32>` (shape ())."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        """The element count, exact (numpy's int64 product would wrap for absurd shapes)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * numpy_dtype(self.dtype).itemsize

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def with_shape(self, shape: Iterable[int]) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(self.shape, dtype)

    def __str__(self) -> str:
        return "tensor<" + "".join(f"{d}x" for d in self.shape) + self.dtype + ">"


@dataclass(frozen=True)
class ScalarType:
    """A bare element type (`f32`), the type of values inside a fused kernel's body."""

    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def __str__(self) -> str:
        return self.dtype


Type = TensorType | ScalarType
