"""The symbolic Tensor: an `ir.Value` of the trace being recorded, with numpy-like operators.

Every method emits one op through its trace (`Trace.op`), which infers the result type,
records the user's source location and turns shape errors into `em.ShapeError`. Python
scalars become `ember.constant`s of the tensor's dtype; shapes broadcast as in numpy.
"""

from __future__ import annotations

import math

from ..ir import DTYPES, Value, dtype_of


def axes_list(axis, ndim: int) -> list[int]:
    """`axis` (None = all, int, or tuple) as a list, negative axes made positive when valid."""
    axes = range(ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
    return [a % ndim if -ndim <= a < ndim else a for a in axes]


def scalar_axes(x: Tensor, axis) -> None:
    """torch lets a 0-d tensor take dim 0 or -1 (as if it had one axis of size 1)."""
    for a in (axis,) if isinstance(axis, int) else axis:
        if a not in (0, -1):
            raise x.trace.error(f"axis {a} is out of range for a 0-d tensor (0 or -1, as torch)")


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """torch.matmul: a 1-D operand is a row on the left or a column on the right, and that
    dim is removed from the result; batch dims broadcast (`ember.matmul` needs rank >= 2)."""
    if a.ndim > 1 and b.ndim > 1:
        return a.trace.op("ember.matmul", a, b)
    if 0 in (a.ndim, b.ndim) or a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise a.trace.error(f"matmul: shapes {list(a.shape)} and {list(b.shape)} do not "
                            "multiply")
    y = a.trace.op("ember.matmul", a.reshape(1, a.shape[0]) if a.ndim == 1 else a,
                   b.reshape(b.shape[0], 1) if b.ndim == 1 else b)
    rows, cols = y.shape[-2:-1] if a.ndim > 1 else (), y.shape[-1:] if b.ndim > 1 else ()
    return y.reshape(y.shape[:-2] + rows + cols)


class Tensor:
    """A value of the graph being traced; `shape` and `dtype` are concrete."""

    __slots__ = ("value", "trace")
    __array_ufunc__ = None  # so `np_array + tensor` calls tensor.__radd__

    def __init__(self, value: Value, trace):
        self.value, self.trace = value, trace

    shape = property(lambda self: self.value.type.shape)
    dtype = property(lambda self: self.value.type.dtype)
    ndim = property(lambda self: len(self.shape))
    type = property(lambda self: self.value.type)

    def _binary(self, name: str, other, reflected: bool = False, **attrs) -> Tensor:
        other = self.trace.lift(other, self.dtype)
        a, b = (other, self) if reflected else (self, other)
        return self.trace.op(name, a, b, **attrs)

    def __add__(self, o): return self._binary("ember.add", o)
    def __radd__(self, o): return self._binary("ember.add", o, True)
    def __sub__(self, o): return self._binary("ember.sub", o)
    def __rsub__(self, o): return self._binary("ember.sub", o, True)
    def __mul__(self, o): return self._binary("ember.mul", o)
    def __rmul__(self, o): return self._binary("ember.mul", o, True)
    def __truediv__(self, o): return self._binary("ember.div", o)
    def __rtruediv__(self, o): return self._binary("ember.div", o, True)
    def __pow__(self, o): return self._binary("ember.pow", o)
    def __rpow__(self, o): return self._binary("ember.pow", o, True)
    def __matmul__(self, o): return matmul(self, self.trace.lift(o, self.dtype))
    def __rmatmul__(self, o): return matmul(self.trace.lift(o, self.dtype), self)
    def __lt__(self, o): return self._binary("ember.cmp", o, predicate="lt")
    def __le__(self, o): return self._binary("ember.cmp", o, predicate="le")
    def __gt__(self, o): return self._binary("ember.cmp", o, predicate="gt")
    def __ge__(self, o): return self._binary("ember.cmp", o, predicate="ge")
    def __eq__(self, o): return self._binary("ember.cmp", o, predicate="eq")
    def __ne__(self, o): return self._binary("ember.cmp", o, predicate="ne")
    def __neg__(self): return self.trace.op("ember.neg", self)

    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError("a traced Tensor has no truth value at trace time; branch on shapes or "
                        "on flag Params (python bools), or use ember.select")

    def exp(self): return self.trace.op("ember.exp", self)
    def log(self): return self.trace.op("ember.log", self)
    def sqrt(self): return self.trace.op("ember.sqrt", self)
    def abs(self): return self.trace.op("ember.abs", self)
    def relu(self): return self.trace.op("ember.relu", self)
    def sigmoid(self): return self.trace.op("ember.sigmoid", self)
    def tanh(self): return self.trace.op("ember.tanh", self)

    def _reduce(self, name: str, axis, keepdims: bool) -> Tensor:
        if self.ndim == 0 and axis is not None:  # torch's dim 0 or -1 of a scalar: itself
            scalar_axes(self, axis)
            return self.reshape(1)._reduce(name, 0, False)
        return self.trace.op(name, self, axes=axes_list(axis, self.ndim), keepdims=bool(keepdims))

    def sum(self, axis=None, keepdims=False):
        return self._reduce("ember.reduce_sum", axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return self._reduce("ember.reduce_mean", axis, keepdims)

    def max(self, axis=None, keepdims=False):
        """Over an empty axis there is no max: rejected (as torch and numpy do) rather than
        left to backends that would disagree (-inf on cpu, an error on the interpreter)."""
        empty = [a for a in axes_list(axis, self.ndim) if 0 <= a < self.ndim and not self.shape[a]]
        if empty:
            raise self.trace.error(f"max: axis {empty[0]} of {list(self.shape)} is empty")
        return self._reduce("ember.reduce_max", axis, keepdims)

    def reshape(self, *shape) -> Tensor:
        """`reshape(2, -1)` or `reshape((2, -1))`; one -1 takes what is left."""
        shape = [int(d) for d in (shape[0] if len(shape) == 1 and not isinstance(shape[0], int)
                                  else shape)]
        if shape.count(-1) > 1:
            raise self.trace.error(f"reshape: more than one -1 in {shape}")
        if -1 in shape:
            known = -math.prod(shape)
            size = self.value.type.size
            if known == 0 or size % known:
                raise self.trace.error(f"reshape: cannot reshape {list(self.shape)} to {shape}")
            shape[shape.index(-1)] = size // known
        return self.trace.op("ember.reshape", self, shape=shape)

    def transpose(self, *perm) -> Tensor:
        """`transpose()` reverses the axes; `transpose(1, 0, 2)` or `transpose((1, 0, 2))`."""
        if len(perm) == 1 and not isinstance(perm[0], int):
            perm = perm[0]
        perm = [int(p) for p in perm] or list(reversed(range(self.ndim)))
        return self.trace.op("ember.transpose", self, perm=perm)

    @property
    def T(self) -> Tensor:
        return self.transpose()

    def astype(self, dtype) -> Tensor:
        dtype = dtype if dtype in DTYPES else dtype_of(dtype)
        return self if dtype == self.dtype else self.trace.op("ember.cast", self, dtype=dtype)

    def __repr__(self) -> str:
        return f"Tensor(shape={list(self.shape)}, dtype={self.dtype})"
