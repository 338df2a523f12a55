"""ONNX's element-wise indexing ops and its sequences, lowered onto `ember.gather` and
`ember.scatter_add` with flat positions: GatherElements, GatherND, ScatterElements and
ScatterND (reduction none or add), each with its indices known at import (numpy index
arithmetic, checked: an index out of range is an OnnxImportError) or traced (the same
arithmetic as ops; out-of-range indices are then the model's error, as in onnxruntime);
SplitToSequence, SequenceAt, ConcatFromSequence and their kin on sequences whose length is
known at import (a Python list of values).

`NUMPY_FOLDS`: the ops whose import-time fold (onnx_import.fold) ember computes itself, as
ONNX's reference implementation gets them wrong: its GatherElements uses `np.choose`,
which takes at most 64 choices, and past that falls back to code that ignores the axis and
all but the first index of each row (an error, or silently wrong values).
"""

from __future__ import annotations

import math

import numpy as np

from ..frontend import functional as F
from ..frontend.joining import stack
from ..frontend.tensor import Tensor
from .onnx_lower import concat, element_base, gather, strides, take_elements, tensor
from .onnx_read import Node
from .onnx_rules import attr, fail, ints, norm_axis, rule

REDUCTIONS = ("none", "add")


def _reduction_check(node: Node) -> list[str]:
    r = attr(node, "reduction", "none")
    return [] if r in REDUCTIONS else [f"reduction={r!r} is not supported (ember has "
                                       "'none' and 'add')"]


# -- index arithmetic ----------------------------------------------------------------------

def _static_index(node: Node, idx: np.ndarray, n: int, what: str) -> np.ndarray:
    """An index array known at import, in [-n, n), as int64 in [0, n)."""
    idx = np.asarray(idx)
    if idx.size and idx.dtype.kind not in "iu":
        raise fail(node, f"{what} must be integers, got {idx.dtype}")
    idx = idx.astype(np.int64)
    bad = idx[(idx < -n) | (idx >= n)]
    if bad.size:
        raise fail(node, f"{what} {int(bad.reshape(-1)[0])} is out of range for a dim of "
                         f"size {n}")
    return np.where(idx < 0, idx + n, idx)


def _traced_index(node: Node, idx: Tensor, n: int, what: str) -> Tensor:
    if idx.dtype not in ("i64", "i32"):
        raise fail(node, f"{what} must be int64 or int32, got {idx.dtype}")
    idx = idx.astype("i64")
    return F.where(idx < 0, idx + n, idx)


def _elements_flat(node: Node, shape: tuple, idx, axis: int):
    """The flat positions in an array of `shape` that GatherElements/ScatterElements index
    `idx` (numpy or a Tensor) along `axis` reaches."""
    ishape = tuple(idx.shape)
    if len(ishape) != len(shape):
        raise fail(node, f"indices {list(ishape)} and data {list(shape)} differ in rank")
    if any(i > d for k, (i, d) in enumerate(zip(ishape, shape)) if k != axis):
        raise fail(node, f"indices {list(ishape)} are larger than data {list(shape)} on a "
                         f"dim other than the axis {axis}")
    base, stride = element_base(shape, ishape, axis)
    n = shape[axis]
    if isinstance(idx, Tensor):
        return _traced_index(node, idx, n, "indices") * stride + base
    return _static_index(node, idx, n, "indices") * stride + base


def _nd_rows(node: Node, shape: tuple, idx, batch: int):
    """GatherND/ScatterND: the data as rows (data.shape[:batch+m] flattened), and the row
    each index tuple (the last dim of `idx`, m long) of `idx` selects: shape idx[:-1]."""
    ishape = tuple(idx.shape)
    if not ishape:
        raise fail(node, "indices must have rank >= 1")
    m = ishape[-1]
    if not 1 <= m <= len(shape) - batch:
        raise fail(node, f"index tuples of length {m} do not fit data {list(shape)} "
                         f"(batch_dims {batch})")
    if ishape[:batch] != tuple(shape[:batch]):
        raise fail(node, f"the batch dims of indices {list(ishape)} and data {list(shape)} "
                         "differ")
    st = strides(shape[:batch + m])
    base = np.zeros(ishape[:-1], np.int64)
    for d in range(batch):
        n = ishape[d]
        base += (np.arange(n, dtype=np.int64) * st[d]).reshape(
            [n if i == d else 1 for i in range(len(ishape) - 1)])
    rows = base
    for j in range(m):
        n, s = shape[batch + j], st[batch + j]
        if isinstance(idx, Tensor):
            rows = _traced_index(node, idx[..., j], n, "indices") * s + rows
        else:
            rows = rows + _static_index(node, np.asarray(idx)[..., j], n, "indices") * s
    return rows, math.prod(shape[:batch + m]), tuple(shape[batch + m:])


def _last_writes(flat: np.ndarray) -> np.ndarray:
    """Which entries of a flat index array to keep so that each position is written once,
    by its last write (what a sequential scatter leaves)."""
    _, first_of_reversed = np.unique(flat[::-1], return_index=True)
    return np.sort(flat.size - 1 - first_of_reversed)


def _scatter(node: Node, table: Tensor, rows, upd: Tensor, reduction: str) -> Tensor:
    """`table` (rows, *rest) with `upd` (rows.shape + rest) written (reduction "none") or
    added ("add") at `rows`: one `ember.scatter_add` of the updates, then a select with the
    written rows (a numpy mask when rows are known: duplicates keep their last write) or
    an add. Bools are scattered as int64."""
    t = table.trace
    n, rest = table.shape[0], tuple(table.shape[1:])
    want = tuple(np.shape(rows)) + rest
    if tuple(upd.shape) != want:
        raise fail(node, f"updates {list(upd.shape)} do not fit: want {list(want)}")
    work = "i64" if table.dtype == "i1" else table.dtype
    x, upd = table.astype(work), upd.astype(work)
    if reduction == "add":
        y = x + t.op("ember.scatter_add", tensor(rows).astype("i64"), upd, shape=[n, *rest])
    else:
        if isinstance(rows, Tensor):
            ones = tensor(np.ones(rows.shape, np.int64))
            mask = t.op("ember.scatter_add", rows.astype("i64"), ones, shape=[n]) > 0
        else:
            flat = np.asarray(rows).reshape(-1)
            keep = _last_writes(flat)
            upd = upd.reshape((flat.size, *rest))
            if keep.size < flat.size:
                upd = gather(upd, keep, 0)
            rows = flat[keep]
            m = np.zeros(n, bool)
            m[rows] = True
            mask = tensor(m)
        mask = mask.reshape((n,) + (1,) * len(rest))
        written = t.op("ember.scatter_add", tensor(rows).astype("i64"), upd, shape=[n, *rest])
        y = F.where(mask, written, x)
    return y != 0 if table.dtype == "i1" else y


# -- numpy folds -------------------------------------------------------------------------

def _fold_gather_elements(node: Node, data, idx) -> list[np.ndarray]:
    data, idx = np.asarray(data), np.asarray(idx)
    axis = norm_axis(node, attr(node, "axis", 0), data.ndim)
    flat = _elements_flat(node, data.shape, idx, axis)
    return [data.reshape(-1)[flat]]


# op -> numpy function(node, *inputs) -> outputs, used by onnx_import.fold instead of
# ONNX's reference implementation
NUMPY_FOLDS = {"GatherElements": _fold_gather_elements}


# -- gathers and scatters ------------------------------------------------------------------

@rule("GatherElements", attrs="axis")
def _gather_elements(node, data, idx):
    x = tensor(data)
    axis = norm_axis(node, attr(node, "axis", 0), x.ndim)
    return take_elements(x, _elements_flat(node, x.shape, idx, axis))


@rule("ScatterElements", attrs="axis reduction", check=_reduction_check)
def _scatter_elements(node, data, idx, updates):
    x, upd = tensor(data), tensor(updates)
    axis = norm_axis(node, attr(node, "axis", 0), x.ndim)
    if tuple(np.shape(idx)) != tuple(upd.shape):
        raise fail(node, f"indices {list(np.shape(idx))} and updates {list(upd.shape)} "
                         "differ in shape")
    flat = _elements_flat(node, x.shape, idx, axis)
    y = _scatter(node, x.reshape(-1), flat, upd, attr(node, "reduction", "none"))
    return y.reshape(x.shape)


@rule("GatherND", attrs="batch_dims")
def _gather_nd(node, data, idx):
    x = tensor(data)
    rows, n, rest = _nd_rows(node, x.shape, idx, attr(node, "batch_dims", 0))
    return gather(x.reshape((n, *rest)), rows, 0)


@rule("ScatterND", attrs="reduction", check=_reduction_check)
def _scatter_nd(node, data, idx, updates):
    x, upd = tensor(data), tensor(updates)
    rows, n, rest = _nd_rows(node, x.shape, idx, 0)
    y = _scatter(node, x.reshape((n, *rest)), rows, upd, attr(node, "reduction", "none"))
    return y.reshape(x.shape)


# -- sequences (a Python list of values, its length known at import) ----------------------

def _sequence(node: Node, seq) -> list:
    if not isinstance(seq, list):
        raise fail(node, "its input is not a sequence")
    return seq


def _position(node: Node, seq: list, pos, end: bool = False) -> int:
    """A position in `seq` (negative from the end; `end`: len(seq) is one too)."""
    p, n = int(np.asarray(pos).reshape(-1)[0]), len(seq)
    if not -n <= p < n + end:
        raise fail(node, f"position {p} is out of range for a sequence of {n}")
    return p + n if p < 0 else p


@rule("SplitToSequence", attrs="axis keepdims", static=(1,))
def _split_to_sequence(node, x, split=None):
    x = tensor(x)
    axis = norm_axis(node, attr(node, "axis", 0), x.ndim)
    n = x.shape[axis]
    if split is None:
        parts = list(x.split(1, axis)) if n else []
        if not attr(node, "keepdims", 1):
            parts = [p.squeeze(axis) for p in parts]
        return parts
    s = np.asarray(split)
    if s.ndim == 0:
        if int(s) < 1:
            raise fail(node, f"a split size of {int(s)}")
        sizes = [min(int(s), n - i) for i in range(0, n, int(s))]
    else:
        sizes = ints(s)
        if sum(sizes) != n or any(k < 0 for k in sizes):
            raise fail(node, f"split sizes {sizes} do not add up to axis {axis} of "
                             f"{list(x.shape)}")
    return list(x.split(sizes, axis))


@rule("SequenceAt", static=(1,))
def _sequence_at(node, seq, pos):
    seq = _sequence(node, seq)
    return seq[_position(node, seq, pos)]


@rule("SequenceConstruct")
def _sequence_construct(node, *xs):
    return list(xs)


@rule("SequenceLength")
def _sequence_length(node, seq):
    return np.array(len(_sequence(node, seq)), np.int64)


@rule("SequenceInsert", static=(2,))
def _sequence_insert(node, seq, x, pos=None):
    seq = list(_sequence(node, seq))
    seq.insert(len(seq) if pos is None else _position(node, seq, pos, end=True), x)
    return seq


@rule("SequenceErase", static=(1,))
def _sequence_erase(node, seq, pos=None):
    seq = list(_sequence(node, seq))
    if not seq:
        raise fail(node, "erasing from an empty sequence")
    del seq[-1 if pos is None else _position(node, seq, pos)]
    return seq


@rule("ConcatFromSequence", attrs="axis new_axis")
def _concat_from_sequence(node, seq):
    seq = _sequence(node, seq)
    if not seq:
        raise fail(node, "concatenating an empty sequence")
    new = bool(attr(node, "new_axis", 0))
    rank = np.ndim(seq[0]) + new
    if "axis" not in node.attrs:
        raise fail(node, "it has no axis attribute")
    axis = norm_axis(node, attr(node, "axis"), rank)
    if all(isinstance(v, np.ndarray) for v in seq):
        return np.stack(seq, axis) if new else np.concatenate(seq, axis)
    xs = [tensor(v) for v in seq]
    if new:
        if len({x.shape for x in xs}) > 1:
            raise fail(node, f"stacking different shapes {[list(x.shape) for x in xs]}")
        return stack(xs, axis)
    if len({x.ndim for x in xs}) > 1:
        raise fail(node, f"its tensors have different ranks {[x.ndim for x in xs]}")
    return concat(xs, axis)
