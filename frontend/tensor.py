"""The symbolic Tensor: an `ir.Value` of the trace being recorded, with numpy-like operators.

Every method emits one op through its trace (`Trace.op`), which infers the result type,
records the user's source location and turns shape errors into `em.ShapeError`. Python
scalars become `ember.constant`s of the tensor's dtype; shapes broadcast as in numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..ir import DTYPES, Value, dtype_of

# Tensor's methods that are compositions built on Tensor live in modules that import this
# one (indexing.py, joining.py, selection.py, numpy_functions.py); each registers its
# function here by name with `implements`, and the method calls it (no import back).
_IMPLEMENTATIONS: dict[str, Callable] = {}


def implements(fn: Callable) -> Callable:
    """Register `fn` as what Tensor's method of the same name does."""
    _IMPLEMENTATIONS[fn.__name__] = fn
    return fn


def _by(name: str) -> Callable:
    return _IMPLEMENTATIONS[name]


def axes_list(axis, ndim: int) -> list[int]:
    """`axis` (None = all, int, or tuple) as a list, negative axes made positive when valid."""
    axes = range(ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
    return [a % ndim if -ndim <= a < ndim else a for a in axes]


def scalar_axes(x: Tensor, axis) -> None:
    """torch lets a 0-d tensor take dim 0 or -1 (as if it had one axis of size 1)."""
    for a in (axis,) if isinstance(axis, int) else axis:
        if a not in (0, -1):
            raise x.trace.error(f"axis {a} is out of range for a 0-d tensor (0 or -1, as torch)")


def _spelled(x: Tensor, axis, keepdims, dim, keepdim) -> tuple:
    """(axis, keepdims) from numpy's spelling or torch's (`dim`, `keepdim`), not both."""
    if dim is not None:
        if axis is not None:
            raise x.trace.error("give axis or dim, not both")
        axis = dim
    return axis, keepdims if keepdim is None else keepdim


def _axis(x: Tensor, d: int, ndim: int | None = None) -> int:
    """Dim `d` (negative counts from the end) of a tensor of rank `ndim` (x's)."""
    n = x.ndim if ndim is None else ndim
    if not -n <= d < n:
        raise x.trace.error(f"dim {d} is out of range for {list(x.shape)}")
    return d % n


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
    def sign(self): return self.trace.op("ember.sign", self)
    def relu(self): return self.trace.op("ember.relu", self)
    def sigmoid(self): return self.trace.op("ember.sigmoid", self)
    def tanh(self): return self.trace.op("ember.tanh", self)

    def _reduce(self, name: str, axis, keepdims: bool) -> Tensor:
        if self.ndim == 0 and axis is not None:  # torch's dim 0 or -1 of a scalar: itself
            scalar_axes(self, axis)
            return self.reshape(1)._reduce(name, 0, False)
        return self.trace.op(name, self, axes=axes_list(axis, self.ndim), keepdims=bool(keepdims))

    # Reductions take numpy's spelling (axis, keepdims) and torch's (dim, keepdim).
    def sum(self, axis=None, keepdims=False, *, dim=None, keepdim=None):
        return self._reduce("ember.reduce_sum", *_spelled(self, axis, keepdims, dim, keepdim))

    def mean(self, axis=None, keepdims=False, *, dim=None, keepdim=None):
        return self._reduce("ember.reduce_mean", *_spelled(self, axis, keepdims, dim, keepdim))

    def _max(self, axis, keepdims) -> Tensor:
        """Over an empty axis there is no max: rejected (as torch and numpy do) rather than
        left to backends that would disagree (-inf on cpu, an error on the interpreter)."""
        empty = [a for a in axes_list(axis, self.ndim) if 0 <= a < self.ndim and not self.shape[a]]
        if empty:
            raise self.trace.error(f"max: axis {empty[0]} of {list(self.shape)} is empty")
        return self._reduce("ember.reduce_max", axis, keepdims)

    def max(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        """torch's `max(dim)`: (values, indices) along dim; numpy's `max()`, `max(axis=...)`
        and `max(axis, keepdims=...)`: the values alone."""
        if dim is None or keepdims is not None:
            return self._max(dim if axis is None else axis, bool(keepdims))
        return _by("max_along")(self, dim, keepdim)

    def min(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        """torch's `min(dim)`: (values, indices); numpy's spellings: the values."""
        if dim is None or keepdims is not None:
            return -(-self)._max(dim if axis is None else axis, bool(keepdims))
        return _by("min_along")(self, dim, keepdim)

    def amax(self, dim=None, keepdim=False):
        """torch.amax: the largest values along `dim`."""
        return self._max(dim, keepdim)

    def amin(self, dim=None, keepdim=False):
        """torch.amin: the smallest values along `dim` (the max of the negation, negated)."""
        return -(-self)._max(dim, keepdim)

    def argmax(self, dim=None, keepdim=False):
        return _by("argmax")(self, dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        return _by("argmin")(self, dim, keepdim)

    def cumsum(self, dim, dtype=None):
        return _by("cumsum")(self, dim, dtype)

    def var(self, dim=None, keepdim=False, *, correction=1):
        """torch.var: the mean squared deviation over `dim`, divided by N - correction."""
        axes = axes_list(dim, self.ndim) if self.ndim else []
        n = math.prod(self.shape[a] for a in axes)
        d = self - self.mean(dim, keepdims=True)
        return (d * d).sum(dim, keepdim) / max(n - correction, 0)

    def std(self, dim=None, keepdim=False, *, correction=1):
        """torch.std: the square root of `var`."""
        return self.var(dim, keepdim, correction=correction).sqrt()

    # Shapes, as torch spells them.
    def size(self, dim=None):
        """torch's `size()`: the shape, or the size of one dim."""
        return tuple(self.shape) if dim is None else self.shape[_axis(self, dim)]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return self.value.type.size

    def view(self, *shape) -> Tensor:
        """torch's `view`: a reshape (ember's tensors are values: there is no storage to
        share, and no copy is made where a reshape needs none)."""
        return self.reshape(*shape)

    def contiguous(self) -> Tensor:
        """torch's `contiguous`: itself (a value has no layout to fix; kernels read views in
        place or copy what they need)."""
        return self

    def unsqueeze(self, dim: int) -> Tensor:
        d = _axis(self, dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self, dim=None) -> Tensor:
        """Without `dim`, every size-1 dim goes; with it, that one if its size is 1."""
        dims = [i for i, n in enumerate(self.shape) if n == 1] if dim is None else \
            [d for d in axes_list(dim, self.ndim) if self.shape[d] == 1]
        return self.reshape(tuple(n for i, n in enumerate(self.shape) if i not in dims))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        a, b = _axis(self, start_dim), _axis(self, end_dim)
        return self.reshape(self.shape[:a] + (math.prod(self.shape[a:b + 1]),)
                            + self.shape[b + 1:])

    def unflatten(self, dim: int, sizes) -> Tensor:
        d = _axis(self, dim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])

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
        """torch's `transpose(d0, d1)` swaps two dims (negative ones too); numpy's
        `transpose()` reverses the axes, `transpose(1, 0, 2)` or `transpose((1, 0, 2))`
        permutes them."""
        if len(perm) == 2 and all(isinstance(p, int) for p in perm):
            a, b = (_axis(self, p) for p in perm)
            order = list(range(self.ndim))
            order[a], order[b] = b, a
            perm = (order,)
        if len(perm) == 1 and not isinstance(perm[0], int):
            perm = perm[0]
        perm = [int(p) for p in perm] or list(reversed(range(self.ndim)))
        return self.trace.op("ember.transpose", self, perm=perm)

    def permute(self, *dims) -> Tensor:
        """torch's `permute(2, 0, 1)` (or a tuple): dims in their new order."""
        dims = dims[0] if len(dims) == 1 and not isinstance(dims[0], int) else dims
        return self.trace.op("ember.transpose", self, perm=[_axis(self, d) for d in dims])

    @property
    def T(self) -> Tensor:
        return self.transpose()

    @property
    def mT(self) -> Tensor:
        """The last two dims swapped (torch's batched matrix transpose)."""
        return self.transpose(-2, -1)

    def expand(self, *sizes) -> Tensor:
        """torch's `expand`: broadcast to `sizes`, -1 keeping a dim's size."""
        sizes = sizes[0] if len(sizes) == 1 and not isinstance(sizes[0], int) else sizes
        lead = len(sizes) - self.ndim
        shape = [self.shape[i - lead] if n == -1 else n for i, n in enumerate(sizes)]
        return self.trace.op("ember.broadcast", self, shape=[int(n) for n in shape])

    def masked_fill(self, mask, value) -> Tensor:
        """`value` where `mask` (a comparison's result) holds, else self, broadcast."""
        mask = self.trace.lift(mask)
        if mask.dtype != "i1":
            raise self.trace.error(f"masked_fill: the mask must be a boolean tensor (a "
                                   f"comparison), got {mask.dtype}")
        return self.trace.op("ember.select", mask, self.trace.lift(value, self.dtype), self)

    def clamp(self, min=None, max=None) -> Tensor:  # noqa: A002  (torch's names)
        """Limited to [min, max] (either may be None; max wins where min > max)."""
        if min is None and max is None:
            raise self.trace.error("clamp: give min, max or both")
        x = self if min is None else self._binary("ember.max", min)
        return x if max is None else x._binary("ember.min", max)

    def __getitem__(self, key) -> Tensor:
        return _by("getitem")(self, key)

    def split(self, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
        return _by("split")(self, split_size_or_sections, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        return _by("chunk")(self, chunks, dim)

    def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
        return _by("unbind")(self, dim)

    def repeat(self, *sizes) -> Tensor:
        return _by("repeat")(self, *sizes)

    def __array_function__(self, func, types, args, kwargs):
        """numpy's functions (np.concatenate, np.where, ...) as ember ops (NEP 18)."""
        return _by("array_function")(func, types, args, kwargs)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """numpy's ufuncs, `array + tensor` among them, as ember ops (NEP 13)."""
        return _by("array_ufunc")(ufunc, method, *inputs, **kwargs)

    def astype(self, dtype) -> Tensor:
        dtype = dtype if dtype in DTYPES else dtype_of(dtype)
        return self if dtype == self.dtype else self.trace.op("ember.cast", self, dtype=dtype)

    def __repr__(self) -> str:
        return f"Tensor(shape={list(self.shape)}, dtype={self.dtype})"

