"""numpy's functions on traced Tensors: the NEP-18 (`__array_function__`) and NEP-13
(`__array_ufunc__`) protocols, so `np.concatenate([t1, t2])`, `np.exp(t)` or
`array + t` inside `forward` record ember ops instead of failing deep inside numpy.

Why a table: numpy calls one entry point for every function it dispatches, so each
mapped function is one entry, numpy function -> adapter, and anything else falls
through to one TypeError that names the function and what to write instead (never a
numpy error from inside numpy, which would blame a "zero-dimensional array"). An
adapter takes numpy's parameter names; `_arguments` binds the call to numpy's own
signature (so positional arguments mean what they mean in the installed numpy) and
refuses, by name, an argument the adapter does not take that is not at its default
(`out=`, `where=`, `initial=`: traced tensors are values, written once). Ufuncs go to
the Tensor operators (the reflected one where the tensor is on the right), so
`array + t` means exactly `t.__radd__(array)`, as it did with `__array_ufunc__ = None`.
Operands keep their dtypes, as with the operators: an f64 array joined to an f32
tensor is ember's dtype error, not numpy's promotion.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable

import numpy as np

from . import context, joining, ops, selection
from .tensor import Tensor, _axis, implements


def _as(x, dtype=None) -> Tensor:
    """x as a Tensor of the trace (arrays become constants), cast to numpy's `dtype=`."""
    x = context.current().lift(x)
    return x if dtype is None else x.astype(np.dtype(dtype))


def _axes(x: Tensor, axis, ndim: int | None = None) -> list[int]:
    """numpy's `axis` (None: all, an int or a tuple) as dims of rank `ndim` (x's)."""
    if axis is None:
        return list(range(x.ndim))
    return [_axis(x, int(a), ndim) for a in (axis if np.ndim(axis) else (axis,))]


def _refused(what: str, hint: str | None = None) -> TypeError:
    hint = hint or _HINTS.get(what) or _HINTS.get(what.rpartition(".")[0]) or (
        "write it with ember's ops (Tensor methods, em.cat/stack/split/where/tril/triu, "
        "em.nn.functional); the numpy functions that work on traced Tensors are "
        + ", ".join(sorted({_name(f) for f in FUNCTIONS} | {_name(u) for u in UFUNCS})))
    return TypeError(f"{what} is not supported on traced ember Tensors; {hint}")


_DATA_SHAPED = ("its result's shape depends on the data, which a traced graph cannot have; "
                "use np.where(c, a, b) (em.where) or x.masked_fill(mask, value)")
_HINTS = {  # what to write instead of the unmapped functions users reach for
    "np.einsum": "write it with @ (np.matmul), np.transpose and np.reshape",
    "np.take": "index the tensor instead: x[indices]",
    "np.nonzero": _DATA_SHAPED, "np.argwhere": _DATA_SHAPED, "np.unique": _DATA_SHAPED,
    "np.where(condition)": _DATA_SHAPED,
    "np.sort": "ember has no sort; np.max/np.argmax find the largest",
    "np.floor_divide": "use em.nn.functional.div(a, b, rounding_mode='floor')",
    "np.fft": "ember has no FFT op",
    "np.linalg": "ember's only linear algebra is @ (np.matmul)",
}


def _name(f) -> str:
    """`np.concatenate`, `np.fft.fft`, `np.exp`: the function as a user spells it."""
    module = "numpy" if isinstance(f, np.ufunc) else f.__module__ or "numpy"
    return "np" + module.removeprefix("numpy") + "." + f.__name__


# -- the adapters: numpy's parameter names, ember's ops ---------------------------------------

def _concatenate(arrays, axis=0, dtype=None) -> Tensor:
    if axis is None:  # numpy: the arrays flattened, then joined
        return joining.cat([_as(a, dtype).reshape(-1) for a in arrays], 0)
    return joining.cat([_as(a, dtype) for a in arrays], axis)


def _split(ary, indices_or_sections, axis=0, equal=True) -> tuple[Tensor, ...]:
    """numpy's split: a number of equal sections (`np.array_split`: the first n % k one
    longer) or the indices where pieces start, converted to torch's sizes."""
    x = _as(ary)
    d = _axis(x, axis)
    n = x.shape[d]
    if np.ndim(indices_or_sections) == 0:
        k = int(indices_or_sections)
        if k < 1 or (equal and n % k):
            raise x.trace.error(f"np.split: {k} sections cannot split dim {d} of "
                                f"{list(x.shape)} equally (np.array_split allows unequal ones)")
        sizes = [n // k + 1] * (n % k) + [n // k] * (k - n % k)
    else:  # as numpy's slices ary[i:j]: negative counts from the end, past n is n
        cuts = [slice(int(i)).indices(n)[1] for i in indices_or_sections]
        points = [0, *cuts, n]
        sizes = [b - a for a, b in zip(points, points[1:])]
        if min(sizes, default=0) < 0:
            raise x.trace.error(f"np.split: indices {list(indices_or_sections)} along dim {d} "
                                f"of {list(x.shape)} must not decrease")
    return joining.split(x, sizes, d)


def _where(condition, x=None, y=None) -> Tensor:
    if x is None or y is None:
        raise _refused("np.where(condition)")
    if all(isinstance(v, (bool, int, float)) for v in (x, y)):  # no tensor to take a dtype of
        x, y = np.asarray(x, np.result_type(x, y)), np.asarray(y, np.result_type(x, y))
    c = _as(condition)
    return ops.where(c if c.dtype == "i1" else c != 0, x, y)  # numpy: nonzero is True


def _clip(a, a_min=None, a_max=None, min=None, max=None) -> Tensor:  # noqa: A002
    return _as(a).clamp(a_min if min is None else min, a_max if max is None else max)


def _dim(axis):
    """numpy's `axis` (None, an int or a sequence of ints) as the Tensor methods take it."""
    return None if axis is None else tuple(int(a) for a in axis) if np.ndim(axis) else int(axis)


def _reduction(method: str) -> Callable:
    """np.sum/mean/max/min/argmax/argmin: the Tensor method of (dim, keepdim)."""
    return lambda a, axis=None, dtype=None, keepdims=False: getattr(_as(a, dtype), method)(
        _dim(axis), bool(keepdims))


def _moment(method: str) -> Callable:
    """np.var/np.std: numpy's `ddof` (or numpy 2's `correction`) is torch's correction."""
    return lambda a, axis=None, dtype=None, ddof=0, keepdims=False, correction=None: getattr(
        _as(a, dtype), method)(_dim(axis), bool(keepdims),
                               correction=ddof if correction is None else correction)


def _cumsum(a, axis=None, dtype=None) -> Tensor:
    x = _as(a)
    return x.reshape(-1).cumsum(0, dtype) if axis is None else x.cumsum(axis, dtype)


def _reshape(a, shape=None, order="C", newshape=None, copy=None) -> Tensor:
    if order != "C":
        raise _refused(f"np.reshape(order={order!r})", "only order='C' (numpy's default) is")
    return _as(a).reshape(shape if newshape is None else newshape)


def _transpose(a, axes=None) -> Tensor:
    x = _as(a)
    return x.transpose() if axes is None else x.permute(_axes(x, axes))


def _expand_dims(a, axis) -> Tensor:
    x = _as(a)
    n = x.ndim + (len(axis) if np.ndim(axis) else 1)
    dims = _axes(x, axis, n)
    if len(set(dims)) < len(dims):
        raise x.trace.error(f"np.expand_dims: repeated axis in {axis}")
    for d in sorted(dims):  # in increasing order, each lands where the result has it
        x = x.unsqueeze(d)
    return x


def _squeeze(a, axis=None) -> Tensor:
    """numpy's squeeze: a named axis must have size 1 (torch's would ignore it)."""
    x = _as(a)
    if axis is None:
        return x.squeeze()
    dims = _axes(x, axis)
    for d in dims:
        if x.shape[d] != 1:
            raise x.trace.error(f"np.squeeze: axis {d} of {list(x.shape)} has size "
                                f"{x.shape[d]}, not 1")
    return x.squeeze(tuple(dims))


def _dot(a, b) -> Tensor:
    """numpy's dot: a product where either is 0-d, else a matmul of (at most) 2-D ones."""
    a, b = ops._pair_of(a, b)
    if 0 in (a.ndim, b.ndim):
        return a * b
    if a.ndim > 2 or b.ndim > 2:
        raise _refused("np.dot of arrays with more than 2 dims",
                       "use np.matmul (@), which broadcasts the batch dims")
    return a @ b


def _tile(A, reps) -> Tensor:
    """numpy's tile: missing reps count as 1 (on the left), then torch's repeat."""
    x = _as(A)
    reps = [int(r) for r in (reps if np.ndim(reps) else (reps,))]
    return x.repeat([1] * (x.ndim - len(reps)) + reps)


FUNCTIONS: dict[Callable, Callable] = {
    np.concatenate: _concatenate,
    np.stack: lambda arrays, axis=0, dtype=None: joining.stack(
        [_as(a, dtype) for a in arrays], axis),
    np.split: _split,
    np.array_split: lambda ary, indices_or_sections, axis=0: _split(
        ary, indices_or_sections, axis, equal=False),
    np.where: _where,
    np.clip: _clip,
    **{f: _reduction(m) for f, m in [
        (np.sum, "sum"), (np.mean, "mean"), (np.max, "amax"), (np.amax, "amax"),
        (np.min, "amin"), (np.amin, "amin"), (np.argmax, "argmax"), (np.argmin, "argmin")]},
    np.var: _moment("var"),
    np.std: _moment("std"),
    np.cumsum: _cumsum,
    np.reshape: _reshape,
    np.ravel: lambda a, order="C": _reshape(a, -1, order),
    np.transpose: _transpose,
    np.swapaxes: lambda a, axis1, axis2: _as(a).transpose(int(axis1), int(axis2)),
    np.expand_dims: _expand_dims,
    np.squeeze: _squeeze,
    np.dot: _dot,
    np.tril: lambda m, k=0: selection.tril(_as(m), k),
    np.triu: lambda m, k=0: selection.triu(_as(m), k),
    np.tile: _tile,
    np.broadcast_to: lambda array, shape: ops.broadcast_to(
        array, shape if np.ndim(shape) else (shape,)),
    np.shape: lambda a: tuple(_as(a).shape),
    np.ndim: lambda a: _as(a).ndim,
    np.size: lambda a, axis=None: math.prod(_as(a).shape[d] for d in _axes(_as(a), axis)),
}


def _operator(method: str, reflected: str) -> Callable:
    """A binary ufunc as the Tensor operator: `reflected` where only the right is a Tensor."""
    def apply(a, b):
        if isinstance(b, Tensor) and not isinstance(a, Tensor):
            return getattr(b, reflected)(a)
        return getattr(_as(a), method)(b)
    return apply


def _method(method: str) -> Callable:
    return lambda x: getattr(_as(x), method)()


UFUNCS: dict[np.ufunc, Callable] = {
    **{u: _operator(f"__{m}__", f"__{r}__") for u, m, r in [
        (np.add, "add", "radd"), (np.subtract, "sub", "rsub"), (np.multiply, "mul", "rmul"),
        (np.true_divide, "truediv", "rtruediv"), (np.power, "pow", "rpow"),
        (np.matmul, "matmul", "rmatmul"), (np.greater, "gt", "lt"), (np.less, "lt", "gt"),
        (np.greater_equal, "ge", "le"), (np.less_equal, "le", "ge"),
        (np.equal, "eq", "eq"), (np.not_equal, "ne", "ne")]},
    **{u: _method(m) for u, m in [
        (np.exp, "exp"), (np.log, "log"), (np.sqrt, "sqrt"), (np.absolute, "abs"),
        (np.tanh, "tanh"), (np.sign, "sign"), (np.negative, "__neg__")]},
    np.square: lambda x: _as(x) * x,
    np.maximum: lambda a, b: ops.maximum(a, b),
    np.minimum: lambda a, b: ops.minimum(a, b),
}


@functools.cache
def _signature(f) -> inspect.Signature | None:
    try:
        return inspect.signature(f)
    except (TypeError, ValueError):  # numpy 1.x's C functions have none
        return None


def _arguments(name: str, func, adapter: Callable, args, kwargs) -> dict:
    """The call's arguments by name, bound to numpy's signature (the adapter's where numpy's
    cannot be read); an argument the adapter does not take must be at numpy's default."""
    sig = _signature(func) or _signature(adapter)
    try:
        bound = sig.bind(*args, **kwargs).arguments
    except TypeError as e:
        raise TypeError(f"{name}: {e}") from None
    for p in sig.parameters.values():  # numpy's **kwargs (np.clip's) as arguments of their own
        if p.kind is p.VAR_KEYWORD:
            bound.update(bound.pop(p.name, {}))
    takes = _signature(adapter).parameters
    given = [k for k, v in bound.items() if k not in takes and v is not None and not (
        k in sig.parameters and (v is sig.parameters[k].default
                                 or isinstance(v, str) and v == sig.parameters[k].default))]
    if given:
        raise _refused(f"{name}({', '.join(k + '=' for k in given)}...)",
                       f"it takes {', '.join(k for k in takes if k in sig.parameters)} (traced "
                       "tensors are values: no out=, where= or initial=)")
    return {k: v for k, v in bound.items() if k in takes}


@implements
def array_function(func, types, args, kwargs):
    """`Tensor.__array_function__` (NEP 18): `func(*args, **kwargs)` as ember ops."""
    if not all(issubclass(t, (Tensor, np.ndarray)) for t in types):
        return NotImplemented  # another library's arrays: let it (or numpy's error) answer
    name = _name(func)
    adapter = FUNCTIONS.get(func)
    if adapter is None:
        raise _refused(name)
    return adapter(**_arguments(name, func, adapter, args, kwargs))


@implements
def array_ufunc(ufunc, method, *inputs, **kwargs):
    """`Tensor.__array_ufunc__` (NEP 13): a ufunc called on Tensors (and arrays, and the
    `array + tensor` operators, which numpy routes here) as ember ops."""
    name = _name(ufunc)
    if method != "__call__":
        raise _refused(f"{name}.{method}", "only calling a ufunc is; for reductions and scans "
                       "use np.sum/np.max/np.min/np.cumsum or the Tensor methods")
    adapter = UFUNCS.get(ufunc)
    if adapter is None:
        raise _refused(name)
    if kwargs:
        raise _refused(f"{name}({', '.join(k + '=' for k in kwargs)}...)",
                       "traced tensors are values: assign the result (`a = a + t`, not an "
                       "in-place `a += t` on a numpy array, which passes out=)")
    return adapter(*inputs)
