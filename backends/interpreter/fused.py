"""numpy reference of the `kernel` dialect: the definition fused graphs are tested against.

A body is evaluated once over the whole iteration space, each scalar value as an array
broadcastable to the space: a block argument is its operand viewed through its map
(`as_strided`, so stride 0 broadcasts and permuted strides transpose), `kernel.index` an
arange along its dim, `kernel.reduce` a numpy reduction with keepdims. Scalar ops reuse
the `ember.*` references, so fused and unfused graphs share one definition of each op
(on bf16 and f16 computed in f32, each result rounded: ir/precision.py).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...ir import Operation, TensorType, numpy_dtype
from ...ir.dialects.kernel import epilogue_maps
from ...ir.dialects.kernel_attention import logical_shapes, result_maps
from ...ir.precision import rounded, widened
from . import rng
from .reference import KERNELS

_REDUCE = {"add": np.sum, "max": np.max, "min": np.min, "mul": np.prod}


def view(a: np.ndarray, shape, strides) -> np.ndarray:
    """`a`'s elements read through element `strides` over `shape` (read-only)."""
    a = np.ascontiguousarray(a).reshape(-1)
    if a.size == 0:
        return np.zeros(shape, a.dtype)
    return as_strided(a, tuple(shape), tuple(s * a.itemsize for s in strides), writeable=False)


def run_body(op: Operation, args: list[np.ndarray], shape) -> list[np.ndarray]:
    """The yielded values of `op`'s body, given one array per block argument."""
    block = op.regions[0].blocks[0]
    env = dict(zip(block.args, args))
    rank = len(shape)
    for s in block.ops:
        a = s.attributes
        vals = [env[v] for v in s.operands]
        if s.name == "kernel.yield":
            return [np.broadcast_to(v, shape) for v in vals]
        vals = [widened(v) for v in vals]
        if s.name == "kernel.constant":
            v = np.array(a["value"])
        elif s.name == "kernel.index":
            d = a["dim"]
            v = np.arange(shape[d], dtype=np.int64).reshape(
                [-1 if i == d else 1 for i in range(rank)])
        elif s.name == "kernel.dropout":
            v = _dropout(a, *vals)
        elif s.name == "kernel.reduce":
            x = np.broadcast_to(vals[0], shape)
            v = _REDUCE[a["kind"]](x, axis=tuple(a["dims"]), keepdims=True)
        else:
            with np.errstate(all="ignore"):
                v = KERNELS["ember." + s.name.removeprefix("kernel.")](a, *vals)
        env[s.result] = rounded(v, s.result.type.dtype)
    raise ValueError(f"{op.name} body has no kernel.yield")


def _dropout(a, x, step, *coords):
    """`ember.dropout` elementwise, given each element's coordinates (see rng.py)."""
    x = np.asarray(x)
    if a["p"] == 0:
        return x
    h = rng.hash_of(rng.coordinate_hash(coords, a.get("rows", 0), step), a["seed"], a["key"],
                    step)
    return rng.scaled(x, rng.kept(h, a["p"]), a["p"])


def place(v: np.ndarray, m: list[int], t: TensorType) -> np.ndarray:
    """A buffer of type `t` holding `v`'s elements where map `m` (over v's shape) puts them."""
    out = np.zeros(t.size, numpy_dtype(t.dtype))
    if out.size and v.size:
        keep = tuple(slice(None) if s else slice(0, 1) for s in m)
        dst = as_strided(out, tuple(d if s else 1 for d, s in zip(v.shape, m)),
                         tuple(s * out.itemsize for s in m))
        dst[...] = v[keep]
    return out.reshape(t.shape)


def store(values: list[np.ndarray], op: Operation, out_maps) -> list[np.ndarray]:
    """Each result's elements from its value over the space, through its out map."""
    return [place(v, m, t) for v, m, t in zip(values, out_maps, op.attributes["out_types"])]


def fused(op: Operation, *args: np.ndarray) -> list[np.ndarray]:
    at = op.attributes
    space = at["space"]
    if 0 in space:  # nothing to compute (a reduce over nothing has no identity to run)
        return [np.zeros(t.shape, numpy_dtype(t.dtype)) for t in at["out_types"]]
    return store(run_body(op, [view(x, space, m) for x, m in zip(args, at["maps"])], space),
                 op, at["out_maps"])


def matmul(op: Operation, *args: np.ndarray) -> list[np.ndarray]:
    at = op.attributes
    space, maps = at["space"], at["maps"]
    nb = len(space) - 3
    batch, (M, N, K) = space[:nb], space[nb:]
    a = view(args[0], [*batch, M, K], maps[0][:nb] + [maps[0][nb], maps[0][nb + 2]])
    b = view(args[1], [*batch, K, N], maps[1][:nb] + [maps[1][nb + 2], maps[1][nb + 1]])
    return _epilogue(op, np.matmul(a, b), args[2:])


def conv2d(op: Operation, *args: np.ndarray) -> list[np.ndarray]:
    """A kernel.conv2d or kernel.conv2d_nhwc: its ember twin's conv, then the body."""
    conv = KERNELS["ember." + op.name.removeprefix("kernel.")]
    return _epilogue(op, conv(op.attributes, *args[:2]), args[2:])


def _epilogue(op: Operation, product: np.ndarray, extras) -> list[np.ndarray]:
    """A kernel.matmul's or kernel.conv2d's results: its body over the product."""
    space, maps, out_maps = epilogue_maps(op)
    return store(run_body(op, [product, *(view(x, space, m) for x, m in zip(extras, maps))],
                          space), op, out_maps)


def _attention_views(op: Operation, names, args) -> list[np.ndarray]:
    shapes = logical_shapes(op.attributes)
    return [view(x, shapes[n], m).astype(np.float64)
            for n, x, m in zip(names, args, op.attributes["maps"])]


def _scores(a: dict, q: np.ndarray, k: np.ndarray) -> np.ndarray:
    s = q @ np.swapaxes(k, -1, -2) * a["scale"]
    if a["causal"]:
        tq, tk = s.shape[-2:]
        s = np.where(np.arange(tk) > np.arange(tq)[:, None], -np.inf, s)
    return s


def _results(op: Operation, values: list[np.ndarray]) -> list[np.ndarray]:
    """The results in their buffers: each logical value through its result map (a bf16
    result is the f32 one rounded: low-precision-attention's)."""
    return [place(x.astype(np.float32) if r.type.dtype == "bf16" else x, m, r.type)
            for x, m, r in zip(values, result_maps(op.name, op.attributes), op.results)]


def attention(op: Operation, *args: np.ndarray) -> list[np.ndarray]:
    """o = softmax(s) v and lse = logsumexp(s) per row, in float64."""
    q, k, v = _attention_views(op, ("q", "k", "v"), args)
    s = _scores(op.attributes, q, k)
    m = s.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
    return _results(op, [np.exp(s - lse) @ v, lse[..., 0]])


def attention_grad(op: Operation, *args: np.ndarray) -> list[np.ndarray]:
    """dq, dk, dv of o = softmax(s) v, from p = exp(s - lse) rebuilt, in float64."""
    a = op.attributes
    q, k, v, o, lse, do = _attention_views(op, ("q", "k", "v", "o", "lse", "do"), args)
    p = np.exp(_scores(a, q, k) - lse[..., None])
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True)) * a["scale"]
    return _results(op, [ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ do])


FUSED = {"kernel.fused": fused, "kernel.matmul": matmul, "kernel.conv2d": conv2d,
         "kernel.conv2d_nhwc": conv2d,
         "kernel.attention": attention, "kernel.attention_grad": attention_grad}
