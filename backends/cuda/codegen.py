"""Graph -> Program: a buffer table, the steps that run the graph, and ONE CUDA C
translation unit holding every kernel (with a line -> op map for compile errors).

Each graph value that needs memory gets a slot: graph inputs and params (bound per
call), constants (uploaded once), op results and scratch (im2col columns, reduction
partials, GEMM accumulators). A reshape takes its operand's slot; a transpose of the
last two axes that only feeds matmuls is no copy at all, just a transposed view cuBLAS
reads. Results and scratch live in ONE arena allocated once: each slot lives from the
first step that touches it to the last, and slots whose lifetimes do not overlap share
bytes (greedy, largest first). Results the graph returns are allocated fresh per call
(the caller keeps them).
Steps are kernel launches, cuBLAS GEMMs (`cupy.matmul` on strided views) and memsets.
This module is pure Python: everything it decides is testable without a GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ...ir import Graph, Operation, TensorType, Value, numpy_dtype, verify
from ...ir.printer import GraphPrinter
from ..errors import CodegenError, UnsupportedOpError
from ..strides import broadcast_strides, contiguous_strides
from . import conv as C
from . import launch as L
from .fused import Body, epilogue_kernel, fused_kernel
from .kernels import (
    Extra,
    Kernel,
    Operand,
    coordinate,
    map_kernel,
    out_operands,
    reduce_kernels,
    transpose_kernel,
)
from .scalar import CTYPE, ELEMENTWISE, PRELUDE, ctype, dropout, expr, literal


class CudaCompileError(CodegenError):
    """NVRTC rejected the generated source; the message shows the line and its IR op."""


@dataclass
class Slot:
    """kind: "arg" (key: input index), "param" (key: param id), "const" (value), "temp" (an
    op result) or "scratch" (an op's working memory). Temps and scratch sit at byte
    `offset` of the arena, except temps the graph returns (`offset` None: fresh per call)."""

    kind: str
    type: TensorType
    key: int | str | None = None
    path: str = ""
    value: np.ndarray | None = None
    offset: int | None = None


@dataclass(frozen=True)
class View:
    """Elements of a slot read through element `strides` over `shape` (a GEMM operand)."""

    slot: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass
class Launch:
    kernel: str
    config: L.LaunchConfig
    args: list[int]  # one slot per kernel parameter, in order
    op: int          # index into Program.ops


@dataclass
class Gemm:
    """out = a @ b through cuBLAS (numpy matmul broadcasting over batch dims)."""

    out: View
    a: View
    b: View
    op: int


@dataclass
class Memset:
    slot: int
    op: int


@dataclass(frozen=True)
class KernelInfo:
    name: str
    first_line: int  # 1-based, inclusive, in Program.source
    last_line: int
    op: int


@dataclass
class Program:
    name: str
    slots: list[Slot] = field(default_factory=list)
    steps: list = field(default_factory=list)
    outputs: list[tuple[int, TensorType]] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    kernels: list[KernelInfo] = field(default_factory=list)
    source: str = ""
    arena_bytes: int = 0

    def memory_report(self) -> dict[str, int]:
        """Device bytes by class: the arena (results and scratch), constants, and per call
        the inputs, params and returned results."""
        def total(*kinds, fresh=None):
            return sum(s.type.nbytes for s in self.slots if s.kind in kinds
                       and (fresh is None or (s.offset is None) == fresh))
        return {"arena_bytes": self.arena_bytes, "constants": total("const"),
                "inputs": total("arg"), "params": total("param"),
                "outputs": total("temp", fresh=True)}

    def locate(self, line: int) -> KernelInfo | None:
        return next((k for k in self.kernels if k.first_line <= line <= k.last_line), None)

    def explain(self, log: str) -> str:
        """A compiler log (NVRTC's or nvcc's `file(LINE): error: ...`) as a message that
        shows the failing source line and the IR op it was generated for."""
        lines = self.source.splitlines()
        errors = [(int(m.group(1)), m.group(0).split(": ", 1)[-1].strip())
                  for m in re.finditer(r"\((\d+)\): (?:catastrophic )?error[^\n]*", log)]
        if not errors:
            return f"CUDA compile of @{self.name} failed:\n{log.strip()}"
        out = [f"CUDA compile of @{self.name} failed ({len(errors)} error"
               f"{'s' if len(errors) > 1 else ''}):"]
        named = set()
        for line, msg in errors[:6]:
            text = lines[line - 1].strip() if 0 < line <= len(lines) else "?"
            k = self.locate(line)
            out += [f"  line {line}: {msg}", f"    {line} | {text}"]
            if k is not None and k.name not in named:
                named.add(k.name)
                out.append(f"  in kernel {k.name}, generated for op: {self.ops[k.op]}")
        return "\n".join(out)


def emit_cuda(graph: Graph, sm_count: int = L.DEFAULT_SMS) -> str:
    """The CUDA C translation unit of every kernel `graph` lowers to."""
    return lower(graph, sm_count).source


def lower(graph: Graph, sm_count: int = L.DEFAULT_SMS) -> Program:
    """Plan storage, steps and source; UnsupportedOpError names the first op without a
    kernel (nn.* ops must be decomposed first)."""
    return _Lowering(verify(graph), sm_count).run()


def _check(op_name: str, t) -> TensorType:
    if not isinstance(t, TensorType) or t.dtype not in CTYPE:
        raise UnsupportedOpError(f"the cuda backend does not support {t} (in '{op_name}'); "
                                 f"supported dtypes: {', '.join(CTYPE)}")
    return t


def _swaps_last_two(perm: list[int]) -> bool:
    r = len(perm)
    return r >= 2 and perm[:-2] == list(range(r - 2)) and perm[-2:] == [r - 1, r - 2]


class _Lowering:
    def __init__(self, graph: Graph, sm_count: int):
        self.graph, self.sm = graph, sm_count
        self.p = Program(graph.name)
        self.where: dict[Value, int] = {}
        self.views: dict[Value, tuple[int, tuple[int, ...]]] = {}  # folded transposes
        self.emitted: list[tuple[Kernel, int]] = []
        self.printer = GraphPrinter(graph, debuginfo=True)

    # -- slots and steps ------------------------------------------------------------------
    def slot(self, kind: str, t: TensorType, **kw) -> int:
        self.p.slots.append(Slot(kind, t, **kw))
        return len(self.p.slots) - 1

    def result(self, v: Value) -> int:
        self.where[v] = self.slot("temp", _check("result", v.type))
        return self.where[v]

    def scratch(self, shape, dtype: str) -> int:
        return self.slot("scratch", TensorType(tuple(shape), dtype))

    def launch(self, kernel: Kernel, args: list[int]) -> None:
        if len(args) != len(kernel.params):
            raise AssertionError(f"{kernel.name}: {len(kernel.params)} params, {len(args)} args")
        self.emitted.append((kernel, self.op_index))
        self.p.steps.append(Launch(kernel.name, kernel.launch, args, self.op_index))

    def view(self, v: Value, shape=None, strides=None) -> View:
        if v in self.views:
            slot, st = self.views[v]
            return View(slot, v.type.shape, st)
        shape = tuple(v.type.shape if shape is None else shape)
        return View(self.where[v], shape,
                    tuple(contiguous_strides(shape) if strides is None else strides))

    def gemm(self, out: View, a: View, b: View) -> None:
        self.p.steps.append(Gemm(out, _drop_broadcast(a), _drop_broadcast(b), self.op_index))

    def name(self, op: Operation, suffix: str = "") -> str:
        base = re.sub(r"\W", "_", op.name.split(".", 1)[-1])
        return f"k{self.op_index}_{base}{suffix}"

    # -- the walk ---------------------------------------------------------------------------
    def run(self) -> Program:
        for i, a in enumerate(self.graph.args):
            self.where[a] = self.slot("arg", _check("graph argument", a.type), key=i,
                                      path=f"%{a.name}" if a.name else "")
        for op in self.graph.ops:
            if op.name == "func.return":
                self.p.outputs = [(self.where[v], v.type) for v in op.operands]
                continue
            text = self.printer.op(op, "").strip().splitlines()
            desc = text[0] + (" ...}" if len(text) > 1 else "")
            self.p.ops.append(desc if len(desc) <= 240 else desc[:237] + "...")
            self.op_index = len(self.p.ops) - 1
            for v in op.operands:
                _check(op.name, v.type)
            self.lower_op(op)
        plan_arena(self.p)
        self.assemble()
        return self.p

    def lower_op(self, op: Operation) -> None:
        n = op.name
        if n == "ember.param":
            self.where[op.result] = self.slot("param", _check(n, op.result.type),
                                              key=op.attributes["id"],
                                              path=op.attributes.get("path", ""))
        elif n == "ember.constant":
            t = _check(n, op.result.type)
            value = np.asarray(op.attributes["value"], dtype=numpy_dtype(t.dtype))
            self.where[op.result] = self.slot("const", t,
                                              value=np.broadcast_to(value, t.shape).copy())
        elif n == "ember.reshape":
            _check(n, op.result.type)
            self.where[op.result] = self.where[op.operands[0]]
        elif n in ELEMENTWISE or n == "ember.broadcast":
            self.elementwise(op)
        elif n == "ember.transpose":
            self.transpose(op)
        elif n in ("ember.reduce_sum", "ember.reduce_mean", "ember.reduce_max"):
            self.reduce(op)
        elif n == "ember.matmul":
            self.matmul(op)
        elif n in _SPECIAL:
            _SPECIAL[n](self, op)
        elif n == "kernel.fused":
            outs = [self.result(r) for r in op.results]
            k = fused_kernel(self.name(op), op, sm_count=self.sm)
            self.launch(k, outs + [self.where[v] for v in op.operands])
        elif n == "kernel.matmul":
            self.kernel_matmul(op)
        else:
            raise UnsupportedOpError(
                f"the cuda backend has no kernel for '{n}': it runs core ember.* ops and "
                "kernel.* fused kernels; run the `decompose` pass first (it lowers nn.* ops)")

    # -- elementwise, transpose, reductions ------------------------------------------------
    def elementwise(self, op: Operation) -> None:
        t = _check(op.name, op.result.type)
        ins = [Operand(v.type.dtype, broadcast_strides(v.type.shape, t.shape))
               for v in op.operands]
        if op.name == "ember.broadcast":
            body = _identity
        else:
            src = op.operands[1 if op.name == "ember.select" else 0].type.dtype
            body = _single(op.name, op.attributes, src)
        k_in = self.epilogue_operand(op)
        if k_in is None:
            out = self.result(op.result)
        else:  # write in place over the GEMM result: an epilogue (bias, activation)
            out = self.where[op.result] = self.where[op.operands[k_in]]
        k = map_kernel(self.name(op), t.shape, out_operands([t.dtype], t.shape), ins, body,
                       restrict=k_in is None, sm_count=self.sm)
        self.launch(k, [out] + [self.where[v] for v in op.operands])

    def epilogue_operand(self, op: Operation) -> int | None:
        """An operand this elementwise op may overwrite: a matmul or conv result of the same
        type whose only use is this op."""
        for k, v in enumerate(op.operands):
            src = v.op
            if (src is not None and src.name in ("ember.matmul", "ember.conv2d")
                    and len(v.uses) == 1 and v.type == op.result.type
                    and self.p.slots[self.where[v]].kind == "temp"):
                return k
        return None

    def transpose(self, op: Operation) -> None:
        x, perm = op.operands[0], op.attributes["perm"]
        users = {u.name for u, _ in op.result.uses}
        if _swaps_last_two(perm) and users <= {"ember.matmul"} and x not in self.views:
            st = contiguous_strides(x.type.shape)
            self.views[op.result] = (self.where[x], tuple(st[p] for p in perm))
            return
        out = self.result(op.result)
        k = transpose_kernel(self.name(op), x.type.shape, perm, x.type.dtype, self.sm)
        self.launch(k, [out, self.where[x]])

    def reduce(self, op: Operation) -> None:
        x = op.operands[0]
        _check(op.name, op.result.type)
        kind = op.name.removeprefix("ember.reduce_")
        axes = sorted(a % x.type.rank for a in op.attributes["axes"])
        kernels, partial, acc_dt = reduce_kernels(self.name(op), kind, x.type.shape, axes,
                                                  x.type.dtype, self.sm)
        out = self.result(op.result)
        if partial:
            buf = self.scratch((partial,), acc_dt)
            self.launch(kernels[0], [buf, self.where[x]])
            self.launch(kernels[1], [out, buf])
        else:
            self.launch(kernels[0], [out, self.where[x]])

    # -- matmul ------------------------------------------------------------------------------
    def matmul(self, op: Operation) -> None:
        a, b = op.operands
        if a.type.dtype == "i1":
            raise UnsupportedOpError("the cuda backend has no matmul of i1 tensors")
        out = self.result(op.result)
        self.gemm(View(out, op.result.type.shape, tuple(contiguous_strides(op.result.type.shape))),
                  self.view(a), self.view(b))

    def kernel_matmul(self, op: Operation) -> None:
        at = op.attributes
        space, maps = at["space"], at["maps"]
        nb = len(space) - 3
        batch, (M, N, K) = space[:nb], space[nb:]
        a, b = op.operands[:2]
        av = View(self.where[a], (*batch, M, K), (*maps[0][:nb], maps[0][nb], maps[0][nb + 2]))
        bv = View(self.where[b], (*batch, K, N), (*maps[1][:nb], maps[1][nb + 2], maps[1][nb + 1]))
        out_space = (*batch, M, N)
        contiguous = tuple(contiguous_strides(out_space))
        outs = [self.result(r) for r in op.results]
        body = Body(op)
        single = (len(outs) == 1 and tuple(at["out_maps"][0][:-1]) == contiguous
                  and at["out_types"][0].dtype == a.type.dtype)
        if single and not body.ops and list(body.yields) == [body.args[0]]:
            self.gemm(View(outs[0], out_space, contiguous), av, bv)  # no epilogue
            return
        acc = outs[0] if single else self.scratch(out_space, a.type.dtype)
        self.gemm(View(acc, out_space, contiguous), av, bv)
        k = epilogue_kernel(self.name(op, "_epilogue"), op, contiguous, restrict=not single,
                            sm_count=self.sm)
        self.launch(k, outs + [acc] + [self.where[v] for v in op.operands[2:]])

    # -- assembly ----------------------------------------------------------------------------
    def assemble(self) -> None:
        head = [f"// ember: CUDA C for @{self.graph.name}, {len(self.emitted)} kernels "
                "(backends/cuda). Each kernel follows the IR op it implements.", PRELUDE]
        text = "\n".join(head) + "\n"
        line = text.count("\n") + 1
        seen = set()
        for k, op_index in self.emitted:
            if k.name in seen:
                continue
            seen.add(k.name)
            comment = self.p.ops[op_index].replace("\\", "/")  # no line splice
            chunk = f"// {comment}\n{k.source}\n"
            n = chunk.count("\n")
            self.p.kernels.append(KernelInfo(k.name, line, line + n - 2, op_index))  # to "}"
            text += chunk
            line += n
        self.p.source = text


def step_slots(step) -> list[int]:
    if isinstance(step, Launch):
        return list(step.args)
    if isinstance(step, Gemm):
        return [step.out.slot, step.a.slot, step.b.slot]
    return [step.slot]


def plan_arena(p: Program) -> None:
    """Offsets in one arena for every temp and scratch slot but the returned ones: a slot
    lives from the first step that touches it to the last; slots alive at a common step
    never share a byte. Largest first, each at the lowest offset that fits."""
    returned = {i for i, _ in p.outputs}
    live: dict[int, list[int]] = {}
    for k, step in enumerate(p.steps):
        for i in step_slots(step):
            if p.slots[i].kind in ("temp", "scratch") and i not in returned:
                live.setdefault(i, [k, k])[1] = k
    for i, s in enumerate(p.slots):  # a result no step touches still gets bytes
        if s.kind in ("temp", "scratch") and i not in returned and i not in live:
            live[i] = [0, len(p.steps)]
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    for i in sorted(live, key=lambda i: (-p.slots[i].type.nbytes, i)):
        first, last = live[i]
        size = L.round_up(max(p.slots[i].type.nbytes, 1))
        offset = 0
        for lo, hi, *_ in sorted(b for b in placed if b[2] <= last and first <= b[3]):
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        p.slots[i].offset = offset
        placed.append((offset, offset + size, first, last))
    p.arena_bytes = max((b[1] for b in placed), default=0)


def _drop_broadcast(v: View) -> View:
    """A GEMM operand that is the same matrix for every batch (batch dims of size 1 or
    stride 0) is passed unbatched, and matmul broadcasts it: no copy."""
    if len(v.shape) > 2 and all(d == 1 or s == 0 for d, s in zip(v.shape[:-2], v.strides)):
        return View(v.slot, v.shape[-2:], v.strides[-2:])
    return v


def _identity(vals, i):
    return [], vals[:1]


def _single(name: str, attrs: dict, dtype: str):
    def body(vals, i):
        return [], [expr(name, attrs, vals, dtype)]
    return body


# -- ops with their own kernels ----------------------------------------------------------------

def _one_hot(lw: _Lowering, op: Operation) -> None:
    (labels,), t = op.operands, op.result.type
    ins = [Operand(labels.type.dtype, (*contiguous_strides(labels.type.shape), 0))]

    def body(vals, i):
        hit = f"((long long){vals[0]} == (long long){coordinate(i, t.shape, t.rank - 1)})"
        return [], [hit if t.dtype == "i1" else f"(({ctype(t.dtype)}){hit})"]

    out = lw.result(op.result)
    lw.launch(map_kernel(lw.name(op), t.shape, out_operands([t.dtype], t.shape), ins, body,
                         sm_count=lw.sm), [out, lw.where[labels]])


def _dropout(lw: _Lowering, op: Operation) -> None:
    x, rng = op.operands
    t, a = op.result.type, op.attributes
    ins = [Operand(t.dtype, tuple(contiguous_strides(t.shape))), Operand("i64", (0,) * t.rank)]

    def body(vals, i):
        return [], [dropout(vals[0], vals[1], i, a, t.dtype)]

    out = lw.result(op.result)
    lw.launch(map_kernel(lw.name(op), t.shape, out_operands([t.dtype], t.shape), ins, body,
                         sm_count=lw.sm), [out, lw.where[x], lw.where[rng]])


def _gather(lw: _Lowering, op: Operation) -> None:
    table, idx = op.operands
    t = op.result.type
    rows, row = table.type.shape[0], math.prod(table.type.shape[1:])
    rest = t.rank - idx.type.rank
    ins = [Operand(idx.type.dtype, (*contiguous_strides(idx.type.shape), *(0,) * rest))]

    def body(vals, i):
        at = "j_" if row == 1 else f"j_ * {row} + {i} % {row}"
        return [f"const long long j_ = (long long){vals[0]};"], [
            f"(j_ >= 0 && j_ < {rows} ? ex0[{at}] : {literal(t.dtype, 0)})"]

    out = lw.result(op.result)
    k = map_kernel(lw.name(op), t.shape, out_operands([t.dtype], t.shape), ins, body,
                   extras=[Extra(table.type.dtype, table.type.size)], sm_count=lw.sm)
    lw.launch(k, [out, lw.where[idx], lw.where[table]])


_ATOMIC = {"f32": "atomicAdd(&ex0[{o}], {v})", "f64": "atomicAdd(&ex0[{o}], {v})",
           "i32": "atomicAdd(&ex0[{o}], {v})",
           "i64": "atomicAdd(reinterpret_cast<unsigned long long*>(&ex0[{o}]), "
                  "(unsigned long long){v})"}


def _scatter_add(lw: _Lowering, op: Operation) -> None:
    idx, upd = op.operands
    t = op.result.type
    if t.dtype not in _ATOMIC:
        raise UnsupportedOpError(f"the cuda backend has no scatter_add of {t.dtype} tensors")
    rows, row = t.shape[0], math.prod(t.shape[1:])
    u = upd.type
    rest = u.rank - idx.type.rank
    ins = [Operand(idx.type.dtype, (*contiguous_strides(idx.type.shape), *(0,) * rest)),
           Operand(u.dtype, tuple(contiguous_strides(u.shape)))]

    def body(vals, i):
        at = "j_" if row == 1 else f"j_ * {row} + {i} % {row}"
        return [f"const long long j_ = (long long){vals[0]};",
                f"if (j_ >= 0 && j_ < {rows}) {_ATOMIC[t.dtype].format(o=at, v=vals[1])};"], []

    out = lw.result(op.result)
    lw.p.steps.append(Memset(out, lw.op_index))
    k = map_kernel(lw.name(op), u.shape, [], ins, body,
                   extras=[Extra(t.dtype, t.size, writable=True)], vectorize=False,
                   sm_count=lw.sm)
    lw.launch(k, [lw.where[idx], lw.where[upd], out])


def _conv_geometry(op: Operation, x_shape, w_shape):
    a = op.attributes
    win = C.Window.conv(x_shape, w_shape, a)
    g = a["groups"]
    n, c = x_shape[:2]
    co = w_shape[0]
    kk = (c // g) * win.kh * win.kw
    pointwise = (win.kh == win.kw == 1 and a["stride"] == [1, 1] and a["padding"] == [0, 0])
    return win, g, n, c, co, kk, pointwise


def _im2col(lw: _Lowering, op: Operation, x: Value, win, g, layout: str, suffix: str) -> int:
    n, c = x.type.shape[:2]
    kk, p = (c // g) * win.kh * win.kw, win.oh * win.ow
    shape = (n, g, kk, p) if layout == "ngkp" else (g, kk, n, p)
    dt = x.type.dtype
    cols = lw.scratch(shape, dt)
    itype = L.index_type(math.prod(shape), x.type.size)
    k = map_kernel(lw.name(op, suffix), shape, out_operands([dt], shape), [],
                   C.im2col_body(n, c, g, win, layout, itype, dt), extras=[Extra(dt, x.type.size)],
                   sm_count=lw.sm)
    lw.launch(k, [cols, lw.where[x]])
    return cols


def _conv2d(lw: _Lowering, op: Operation) -> None:
    x, w = op.operands
    win, g, n, c, co, kk, pointwise = _conv_geometry(op, x.type.shape, w.type.shape)
    p = win.oh * win.ow
    lw.result(op.result)
    if pointwise:
        cols = View(lw.where[x], (n, g, kk, p), tuple(contiguous_strides((n, g, kk, p))))
    else:
        slot = _im2col(lw, op, x, win, g, "ngkp", "_im2col")
        cols = View(slot, (n, g, kk, p), tuple(contiguous_strides((n, g, kk, p))))
    lw.gemm(lw.view(op.result, (n, g, co // g, p)),
            lw.view(w, (1, g, co // g, kk)), cols)


def _conv2d_grad_input(lw: _Lowering, op: Operation) -> None:
    gy, w = op.operands
    x_shape = tuple(op.attributes["input_shape"])
    win, g, n, c, co, kk, pointwise = _conv_geometry(op, x_shape, w.type.shape)
    p = win.oh * win.ow
    dt = gy.type.dtype
    out = lw.result(op.result)
    wt = View(lw.where[w], (1, g, kk, co // g), (0, (co // g) * kk, 1, kk))  # w^T per group
    gv = lw.view(gy, (n, g, co // g, p))
    if pointwise:
        lw.gemm(lw.view(op.result, (n, g, kk, p)), wt, gv)
        return
    dcols = lw.scratch((n, g, kk, p), dt)
    lw.gemm(View(dcols, (n, g, kk, p), tuple(contiguous_strides((n, g, kk, p)))), wt, gv)
    itype = L.index_type(math.prod(x_shape), n * g * kk * p)
    acc = "double" if dt == "f64" else "float"
    k = map_kernel(lw.name(op, "_col2im"), x_shape, out_operands([dt], x_shape), [],
                   C.col2im_body(c, g, win, itype, dt, acc),
                   extras=[Extra(dt, n * g * kk * p)], sm_count=lw.sm)
    lw.launch(k, [out, dcols])


def _conv2d_grad_weight(lw: _Lowering, op: Operation) -> None:
    x, gy = op.operands
    w_shape = tuple(op.attributes["weight_shape"])
    win, g, n, c, co, kk, pointwise = _conv_geometry(op, x.type.shape, w_shape)
    p = win.oh * win.ow
    lw.result(op.result)
    if n == 1:
        gt = lw.view(gy, (g, co // g, p))
    else:  # [n, g, co/g, p] -> [g, co/g, n, p], so one GEMM contracts over n and p
        slot = lw.scratch((g, co // g, n, p), gy.type.dtype)
        k = transpose_kernel(lw.name(op, "_transpose"), (n, g, co // g, p), [1, 2, 0, 3],
                             gy.type.dtype, lw.sm)
        lw.launch(k, [slot, lw.where[gy]])
        gt = View(slot, (g, co // g, n * p), tuple(contiguous_strides((g, co // g, n * p))))
    if pointwise and n == 1:
        cols_t = View(lw.where[x], (g, p, kk), (kk * p, 1, p))
    else:
        slot = _im2col(lw, op, x, win, g, "gknp", "_im2col")
        cols_t = View(slot, (g, n * p, kk), (kk * n * p, 1, n * p))
    lw.gemm(lw.view(op.result, (g, co // g, kk)), gt, cols_t)


def _pool(lw: _Lowering, op: Operation) -> None:
    x = op.operands[0]
    t, a = op.result.type, op.attributes
    x_shape = a["input_shape"] if op.name == "ember.avg_pool2d_grad" else x.type.shape
    win = C.Window.pool(x_shape, a)
    c = t.shape[1]
    itype = L.index_type(t.size, x.type.size)
    dt = t.dtype
    make = {"ember.max_pool2d": C.max_pool_body, "ember.avg_pool2d": C.avg_pool_body,
            "ember.max_pool2d_grad": C.max_pool_grad_body,
            "ember.avg_pool2d_grad": C.avg_pool_grad_body}[op.name]
    extras = [Extra(v.type.dtype, v.type.size) for v in op.operands]
    out = lw.result(op.result)
    k = map_kernel(lw.name(op), t.shape, out_operands([dt], t.shape), [],
                   make(c, win, itype, dt), extras=extras, sm_count=lw.sm)
    lw.launch(k, [out] + [lw.where[v] for v in op.operands])


_SPECIAL = {
    "ember.one_hot": _one_hot,
    "ember.dropout": _dropout,
    "ember.gather": _gather,
    "ember.scatter_add": _scatter_add,
    "ember.conv2d": _conv2d,
    "ember.conv2d_grad_input": _conv2d_grad_input,
    "ember.conv2d_grad_weight": _conv2d_grad_weight,
    "ember.max_pool2d": _pool,
    "ember.avg_pool2d": _pool,
    "ember.max_pool2d_grad": _pool,
    "ember.avg_pool2d_grad": _pool,
}
