"""CUDA C kernel templates: one map kernel for everything elementwise, reductions, and a
tiled transpose.

Every shape is static, so sizes and strides are constants in the source and a kernel's
only arguments are its buffers. The map kernel is a grid-stride loop over an iteration
shape: it loads each operand at that element (through its own strides: 0 where it
broadcasts), runs a *body* (C statements for one element) and stores the results
contiguously. Per-op elementwise kernels, fused kernels, matmul epilogues, dropout,
one_hot, gather/scatter, pooling and im2col are all map kernels with different bodies,
so the elementwise numerics are emitted in one place (`scalar.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..strides import cdiv, collapse, contiguous_strides
from . import launch as L
from .scalar import ITEMSIZE, cast, combine, ctype, identity

# body(values, index) -> (statements, result expressions): `values` are C expressions of
# the operands at this element, `index` the element's row-major flat index.
Body = Callable[[list[str], str], tuple[list[str], list[str]]]


@dataclass(frozen=True)
class Operand:
    """A map-kernel input read (or result written) at every element: its dtype, element
    strides at the iteration shape (0 where it broadcasts) and the element `offset` of
    the iteration's first element (a window: slice, unslice, concat)."""

    dtype: str
    strides: tuple[int, ...]
    offset: int = 0


@dataclass(frozen=True)
class Extra:
    """A buffer the body indexes itself (`ex0`, `ex1`, ...): a gather table, a pooled input,
    scatter_add's output (writable)."""

    dtype: str
    size: int
    writable: bool = False


@dataclass
class Kernel:
    """One `extern "C"` kernel and how to launch it. `params` are the parameter names in
    order; the planner binds one buffer to each."""

    name: str
    source: str
    launch: L.LaunchConfig
    params: list[str] = field(default_factory=list)
    vector: int = 1


def layout(strides: Sequence[int], shape: Sequence[int], offset: int = 0) -> str:
    """"full" (the contiguous tensor of this shape), "scalar" (one element) or "strided"
    (read through offsets: any operand with an element offset, so never as float4)."""
    if offset:
        return "strided"
    dims = collapse(list(zip(shape, zip(contiguous_strides(shape), strides))))
    if all(s[1] == 0 for _, s in dims):
        return "scalar"
    return "full" if all(s[0] == s[1] for _, s in dims) else "strided"


def offsets(index: str, dims: Sequence[tuple[int, Sequence[int]]], names: Sequence[str],
            itype: str) -> list[str]:
    """Statements declaring `names[k]` = sum over dims of (coordinate * dims[.][1][k]), the
    coordinates being `index` unravelled over `dims` (outermost first)."""
    if len(dims) == 1:
        return [f"const {itype} {n} = {_times(index, dims[0][1][k])};"
                for k, n in enumerate(names)]
    lines = [f"{itype} {n} = 0;" for n in names]
    while dims and not any(dims[-1][1]):  # inner dims nothing varies along
        index, dims = f"({index} / {dims[-1][0]})", dims[:-1]
    if not dims:
        return lines
    used = any(any(s) for _, s in dims[1:])
    lines.append(f"{{ {itype} r_ = {index}{', q_' if used else ''};")
    for size, strides in reversed(dims[1:]):
        if any(strides):
            lines.append(f"  q_ = r_ % {size}; r_ /= {size};")
            lines += [f"  {n} += {_times('q_', strides[k])};" for k, n in enumerate(names)
                      if strides[k]]
        else:
            lines.append(f"  r_ /= {size};")
    lines += [f"  {n} += {_times('r_', dims[0][1][k])};" for k, n in enumerate(names)
              if dims[0][1][k]]
    lines.append("}")
    return lines


def _uses(name: str, lines: Sequence[str]) -> bool:
    return any(re.search(rf"\b{name}\b", line) for line in lines)


def _times(x: str, s: int) -> str:
    return "0" if s == 0 else x if s == 1 else f"{x} * {s}"


def _plus(x: str, offset: int) -> str:
    return f"{x} + {offset}" if offset else x


def _span(o: Operand, shape: Sequence[int]) -> int:
    """One past the last element `o` reaches over `shape` (0 for an empty shape)."""
    if not all(shape):
        return 0
    return o.offset + 1 + sum((d - 1) * s for d, s in zip(shape, o.strides))


def indent(lines: Sequence[str], n: int) -> list[str]:
    return [" " * n + line for line in lines]


def signature(name: str, params: list[tuple[str, str, bool]], block: int,
              restrict: bool = True) -> str:
    """`extern "C" __global__ void name(T* out0, const T* in0, ...)`; params are
    (ctype, name, writable)."""
    r = " __restrict__" if restrict else ""
    ps = ", ".join(f"{'' if w else 'const '}{t}*{r} {n}" for t, n, w in params)
    return f'extern "C" __global__ void __launch_bounds__({block}) {name}({ps})'


def out_operands(dtypes: Sequence[str], shape: Sequence[int]) -> list[Operand]:
    """Results written contiguously over the iteration shape."""
    st = tuple(contiguous_strides(shape))
    return [Operand(d, st) for d in dtypes]


def coordinate(index: str, shape: Sequence[int], dim: int) -> str:
    """The coordinate along `dim` of row-major flat `index` over `shape`."""
    inner = math.prod(shape[dim + 1:])
    q = index if inner == 1 else f"({index} / {inner})"
    return q if dim == 0 else f"({q} % {shape[dim]})"


def map_kernel(name: str, shape: Sequence[int], outs: Sequence[Operand], ins: Sequence[Operand],
               body: Body, extras: Sequence[Extra] = (), vectorize: bool = True,
               restrict: bool = True, sm_count: int = L.DEFAULT_SMS) -> Kernel:
    """A grid-stride loop over `shape`: out_k[at(i)] = body(in_0[at(i)], ...)[k], each
    operand's and result's element at(i) being its offset + i . strides. A result with
    stride 0 along a dimension (uniform there) is stored once, at coordinate 0 of it.

    `restrict=False` when a result is written in place over an operand (an epilogue).
    With `vectorize`, f32 kernels whose operands and results are full or scalar use float4.
    """
    n = math.prod(shape)
    itype = L.index_type(n, *(e.size for e in extras), *(_span(o, shape) for o in (*outs, *ins)))
    lays = [layout(o.strides, shape, o.offset) for o in ins]
    out_lays = [layout(o.strides, shape, o.offset) for o in outs]
    dtypes = [o.dtype for o in (*outs, *ins)]
    width = L.vector_width(n, dtypes, lays + ["strided" if lay != "full" else lay
                                            for lay in out_lays]) if vectorize else 1
    params = ([(ctype(o.dtype), f"out{k}", True) for k, o in enumerate(outs)]
              + [(ctype(o.dtype), f"in{k}", False) for k, o in enumerate(ins)]
              + [(ctype(e.dtype), f"ex{k}", e.writable) for k, e in enumerate(extras)])
    cfg = L.elementwise(cdiv(n, width), sm_count)
    head = signature(name, params, cfg.block[0], restrict)
    lines = [head + " {", f"  const {itype} n = {n};"]
    gid = f"({itype})blockIdx.x * blockDim.x + threadIdx.x"
    step = f"({itype})gridDim.x * blockDim.x"

    def scalar_loop(start: str) -> list[str]:
        bufs = [(f"o{k}", o) for k, (o, lay) in enumerate(zip(ins, lays)) if lay == "strided"]
        bufs += [(f"w{k}", o) for k, (o, lay) in enumerate(zip(outs, out_lays))
                 if lay != "full"]
        dims = collapse([(d, tuple(o.strides[a] for _, o in bufs)) for a, d in enumerate(shape)])
        inner = offsets("i", dims, [b for b, _ in bufs], itype) if bufs else []
        stmts, results = body([f"a{k}" for k in range(len(ins))], "i")
        for k, (o, lay) in enumerate(zip(ins, lays)):
            at = {"full": "i", "scalar": "0"}.get(lay, _plus(f"o{k}", o.offset))
            if _uses(f"a{k}", stmts + results):
                inner.append(f"const {ctype(o.dtype)} a{k} = in{k}[{at}];")
        inner += stmts
        for k, (o, lay, r) in enumerate(zip(outs, out_lays, results)):
            once = [coordinate("i", shape, a) + " == 0" for a, (d, s) in
                    enumerate(zip(shape, o.strides)) if s == 0 and d > 1]
            store = f"out{k}[{'i' if lay == 'full' else _plus(f'w{k}', o.offset)}] = {r};"
            inner.append(f"if ({' && '.join(once)}) {store}" if once else store)
        return [f"  for ({itype} i = {start}; i < n; i += {step}) {{", *indent(inner, 4), "  }"]

    if width == 1:
        lines += scalar_loop(gid)
    else:
        lines.append(f"  const {itype} nv = n / {width};")
        lanes = []
        for lane, c in enumerate("xyzw"):
            vals = [f"a{k}.{c}" if lay == "full" else f"a{k}" for k, lay in enumerate(lays)]
            stmts, results = body(vals, f"({width} * v + {lane})")
            lanes += ["{", *indent(stmts, 2),
                      *[f"  r{k}.{c} = {r};" for k, r in enumerate(results)], "}"]
        inner = [(f"const float4 a{k} = reinterpret_cast<const float4*>(in{k})[v];"
                  if lay == "full" else f"const float a{k} = in{k}[0];")
                 for k, lay in enumerate(lays) if _uses(f"a{k}", lanes)]
        inner += [f"float4 r{k};" for k in range(len(outs))] + lanes
        inner += [f"reinterpret_cast<float4*>(out{k})[v] = r{k};" for k in range(len(outs))]
        lines += [f"  for ({itype} v = {gid}; v < nv; v += {step}) {{", *indent(inner, 4),
                  "  }"]
        if n % width:
            lines += scalar_loop(f"nv * {width} + {gid}")
    lines.append("}")
    return Kernel(name, "\n".join(lines) + "\n", cfg, [p[1] for p in params], width)


# -- reductions ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReduceShape:
    """A reduction as (kept dims, reduced dims), each (size, input stride), outermost first;
    outputs are the kept dims, contiguous, in order."""

    kept: tuple[tuple[int, int], ...]
    reduced: tuple[tuple[int, int], ...]

    @property
    def outputs(self) -> int:
        return math.prod(d for d, _ in self.kept)

    @property
    def size(self) -> int:
        return math.prod(d for d, _ in self.reduced)

    @property
    def inner_reduced(self) -> bool:
        """Whether the input's contiguous axis is reduced (then: one block per row)."""
        innermost = min(self.kept + self.reduced, key=lambda d: d[1], default=None)
        return innermost is not None and innermost in self.reduced


def reduce_shape(shape: Sequence[int], axes: Sequence[int]) -> ReduceShape:
    kept: list[tuple[int, int]] = []
    red: list[tuple[int, int]] = []
    last = None
    for a, (d, s) in enumerate(zip(shape, contiguous_strides(shape))):
        if d == 1:
            continue
        group = red if a in axes else kept
        if last is group and group[-1][1] == s * d:
            group[-1] = (group[-1][0] * d, s)
        else:
            group.append((d, s))
        last = group
    return ReduceShape(tuple(kept), tuple(red))


def reduce_acc(kind: str, dtype: str, mean: bool = False) -> tuple[str, str, str]:
    """(accumulator dtype, combine kind, identity) of an add/max/min/mul reduction: the
    dtype itself; f64 for integer means; for bools an int that is or-ed (max) or and-ed
    (min), since warp shuffles do not move bools."""
    if dtype == "i1":
        k = "max" if kind in ("add", "max") else "min"
        return "i32", k, "0" if k == "max" else "1"
    acc = "f64" if mean and dtype not in ("f32", "f64") else dtype
    return acc, kind, identity(kind, acc)


def _finish(kind: str, acc: str, acc_dt: str, out_dt: str, count: int) -> str:
    if out_dt == "i1":
        return f"({acc} != 0)"
    if kind == "mean":
        acc = f"({acc} / ({ctype(acc_dt)}){count})"
    return cast(acc, acc_dt, out_dt)


def reduce_kernels(name: str, kind: str, shape: Sequence[int], axes: Sequence[int],
                   dtype: str, sm_count: int = L.DEFAULT_SMS) -> tuple[list[Kernel], int, str]:
    """The kernels of a sum/mean/max over `axes` of a contiguous `shape` (1 or 2 launches),
    the elements of the partial buffer they need (0: none) and its (accumulator) dtype."""
    rs = reduce_shape(shape, axes)
    O, R = rs.outputs, rs.size
    count = math.prod(shape[a] for a in axes)
    acc_dt, step_kind, ident = reduce_acc("max" if kind == "max" else "add", dtype,
                                          mean=kind == "mean")
    acc_t, in_t = ctype(acc_dt), ctype(dtype)
    plan = L.reduce_plan(O, R, rs.inner_reduced, ITEMSIZE[acc_dt], sm_count)
    itype = L.index_type(math.prod(shape), plan.partial_elems)
    split = plan.splits > 1
    out_t = acc_t if split else ctype(dtype)
    params = [(out_t, "out0", True), (in_t, "in0", False)]
    final = (lambda a: a) if split else (lambda a: _finish(kind, a, acc_dt, dtype, count))
    where = "s * n_out + o" if split else "o"
    load = cast("in0[base + off]", dtype, acc_dt)
    red = [(d, (s,)) for d, s in rs.reduced]
    kept = [(d, (s,)) for d, s in rs.kept]

    def comb(a, b):
        return combine(step_kind, a, b, acc_dt)

    if plan.strategy == "row":
        block = plan.launch.block[0]
        body = [
            "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
            f"const {itype} n_out = {O};",
            f"for ({itype} o = blockIdx.x; o < n_out; o += gridDim.x) {{",
            *indent(offsets("o", kept, ["base"], itype), 2),
            f"  const {itype} s = blockIdx.y, r0 = s * {plan.chunk};",
            f"  const {itype} r1 = r0 + {plan.chunk} < {R} ? r0 + {plan.chunk} : {R};",
            f"  {acc_t} acc = {ident};",
            f"  for ({itype} r = r0 + threadIdx.x; r < r1; r += blockDim.x) {{",
            *indent(offsets("r", red, ["off"], itype), 4),
            f"    acc = {comb('acc', load)};",
            "  }",
            *indent(block_reduce("acc", acc_t, step_kind, acc_dt, ident, block), 2),
            f"  if (threadIdx.x == 0) out0[{where}] = {final('acc')};",
            "}",
        ]
    else:
        block = plan.launch.block[0]
        body = [
            f"const {itype} n_out = {O};",
            f"for ({itype} t = ({itype})blockIdx.x * blockDim.x + threadIdx.x; "
            f"t < n_out * {plan.splits}; t += ({itype})gridDim.x * blockDim.x) {{",
            f"  const {itype} o = t % n_out, s = t / n_out, r0 = s * {plan.chunk};",
            f"  const {itype} r1 = r0 + {plan.chunk} < {R} ? r0 + {plan.chunk} : {R};",
            *indent(offsets("o", kept, ["base"], itype), 2),
            f"  {acc_t} acc = {ident};",
            f"  for ({itype} r = r0; r < r1; ++r) {{",
            *indent(offsets("r", red, ["off"], itype), 4),
            f"    acc = {comb('acc', load)};",
            "  }",
            f"  out0[{where}] = {final('acc')};",
            "}",
        ]
    src = signature(name, params, block) + " {\n" + "\n".join(indent(body, 2)) + "\n}\n"
    kernels = [Kernel(name, src, plan.launch, ["out0", "in0"])]
    if split:
        fin = f"{name}_finish"
        fbody = [
            f"for ({itype} o = ({itype})blockIdx.x * blockDim.x + threadIdx.x; o < {O}; "
            f"o += ({itype})gridDim.x * blockDim.x) {{",
            f"  {acc_t} acc = {ident};",
            f"  for ({itype} s = 0; s < {plan.splits}; ++s) "
            f"acc = {comb('acc', f'in0[s * {O} + o]')};",
            f"  out0[o] = {_finish(kind, 'acc', acc_dt, dtype, count)};",
            "}",
        ]
        fparams = [(ctype(dtype), "out0", True), (acc_t, "in0", False)]
        fsrc = signature(fin, fparams, plan.finalize.block[0]) + " {\n" + \
            "\n".join(indent(fbody, 2)) + "\n}\n"
        kernels.append(Kernel(fin, fsrc, plan.finalize, ["out0", "in0"]))
    return kernels, plan.partial_elems, acc_dt


# -- transpose -------------------------------------------------------------------------------

def transpose_dims(shape: Sequence[int], perm: Sequence[int]):
    """Collapsed (size, (output stride, input stride)) dims of `transpose(x, perm)`, in
    output order."""
    out_shape = [shape[p] for p in perm]
    in_st = contiguous_strides(shape)
    return collapse(list(zip(out_shape, zip(contiguous_strides(out_shape),
                                            [in_st[p] for p in perm]))))


def needs_tile(shape: Sequence[int], perm: Sequence[int]) -> bool:
    """A transpose moves the contiguous axis (so a plain copy would read or write with a
    stride): it goes through a shared-memory tile."""
    dims = transpose_dims(shape, perm)
    return bool(dims) and dims[-1][1][1] != 1 and any(s[1] == 1 for _, s in dims)


def transpose_kernel(name: str, shape: Sequence[int], perm: Sequence[int], dtype: str,
                     sm_count: int = L.DEFAULT_SMS) -> Kernel:
    """out = x.transpose(perm). A tiled kernel when the contiguous axis moves, else a
    strided copy (a map kernel: both sides walk memory in runs)."""
    out_shape = [shape[p] for p in perm]
    if not needs_tile(shape, perm):
        in_st = contiguous_strides(shape)
        return map_kernel(name, out_shape, out_operands([dtype], out_shape),
                          [Operand(dtype, tuple(in_st[p] for p in perm))],
                          lambda v, i: ([], v), sm_count=sm_count)
    dims = transpose_dims(shape, perm)
    a = next(k for k, (_, s) in enumerate(dims) if s[1] == 1)
    (na, (ta, _)), (nb, (_, sb)) = dims[a], dims[-1]
    batch = [d for k, d in enumerate(dims) if k not in (a, len(dims) - 1)]
    nbatch = math.prod(d for d, _ in batch)
    cfg = L.transpose(na, nb, nbatch, ITEMSIZE[dtype])
    itype = L.index_type(math.prod(shape))
    t, tile = ctype(dtype), L.TILE
    body = [
        f"{t}* tile = reinterpret_cast<{t}*>(ember_smem);",
        f"for ({itype} z = blockIdx.z; z < {nbatch}; z += gridDim.z) {{",
        *indent(offsets("z", batch, ["ob", "ib"], itype), 2),
        f"  for ({itype} by = blockIdx.y; by < {cdiv(nb, tile)}; by += gridDim.y) {{",
        f"    for ({itype} bx = blockIdx.x; bx < {cdiv(na, tile)}; bx += gridDim.x) {{",
        f"      const {itype} a0 = bx * {tile}, b0 = by * {tile};",
        f"      for (int j = threadIdx.y; j < {tile}; j += blockDim.y) {{",
        f"        const {itype} a = a0 + threadIdx.x, b = b0 + j;",
        f"        if (a < {na} && b < {nb}) tile[j * {tile + 1} + threadIdx.x] = "
        f"in0[ib + a + {_times('b', sb)}];",
        "      }",
        "      __syncthreads();",
        f"      for (int j = threadIdx.y; j < {tile}; j += blockDim.y) {{",
        f"        const {itype} a = a0 + j, b = b0 + threadIdx.x;",
        f"        if (a < {na} && b < {nb}) out0[ob + {_times('a', ta)} + b] = "
        f"tile[threadIdx.x * {tile + 1} + j];",
        "      }",
        "      __syncthreads();",
        "    }",
        "  }",
        "}",
    ]
    head = signature(name, [(t, "out0", True), (t, "in0", False)], tile * L.TILE_ROWS)
    return Kernel(name, head + " {\n" + "\n".join(indent(body, 2)) + "\n}\n", cfg,
                  ["out0", "in0"])


def block_reduce(acc: str, acc_t: str, kind: str, acc_dt: str, ident: str,
                 block: int) -> list[str]:
    """Statements that combine `acc` over the block and leave the result in every thread
    (warp shuffles, then the warps' partials through shared memory)."""
    comb = combine(kind, acc, f"ember_shfl_down({acc}, d)", acc_dt)
    red = f"reinterpret_cast<{acc_t}*>(ember_smem)"
    return [
        f"for (int d = 16; d > 0; d >>= 1) {acc} = {comb};",
        f"if (lane == 0) {red}[warp] = {acc};",
        "__syncthreads();",
        "if (warp == 0) {",
        f"  {acc} = lane < {max(block // 32, 1)} ? {red}[lane] : {ident};",
        f"  for (int d = 16; d > 0; d >>= 1) {acc} = {comb};",
        f"  if (lane == 0) {red}[0] = {acc};",
        "}",
        "__syncthreads();",
        f"{acc} = {red}[0];",
        "__syncthreads();",
    ]
