"""Graph -> Program (see program.py): the walk that gives each value a slot and each op
its steps, and ONE CUDA C translation unit holding every kernel (with a line -> op map
for compile errors).

A reshape takes its operand's slot; a transpose of the last two axes that only feeds
matmuls is no copy at all, just a transposed view cuBLAS reads. Elementwise ops,
transposes, reductions, matmuls and the `kernel` dialect's fused ops are lowered here;
ops with kernels of their own by the modules whose tables make up LOWERINGS (windows.py,
indexing.py, dropout.py, collective.py, spatial.py, attention.py). Results and scratch
are placed in one arena by `program.plan_arena`.
Steps are kernel launches, cuBLAS GEMMs (`cupy.matmul` on strided views; on bf16/f16
operands a planned GemmEx call, cublas.py) and memsets.
This module is pure Python: everything it decides is testable without a GPU.
"""

from __future__ import annotations

import re

import numpy as np

from ...ir import Graph, Operation, TensorType, Value, numpy_dtype, verify
from ...ir.dialects.kernel import CONV_KERNELS, accumulator_dtype, holds_product
from ...ir.memory_plan import in_place_operands
from ...ir.printer import GraphPrinter
from ..errors import CodegenError, UnsupportedOpError
from ..strides import broadcast_strides, contiguous_strides
from . import attention, collective, cublas, dropout, indexing, spatial, windows
from . import launch as L
from .fused import Body, epilogue_kernel, fused_kernel
from .program import Gemm, KernelInfo, Launch, Program, Slot, View, plan_arena
from .scalar import CTYPE, ELEMENTWISE, PRELUDE, composed_definitions, expr
from .spatial import conv_into, conv_nhwc_into
from .templates import Kernel, Operand, map_kernel, out_operands, reduce_kernels, transpose_kernel

LOWERINGS = {**windows.LOWERINGS, **indexing.LOWERINGS, **dropout.LOWERINGS,
             **collective.LOWERINGS, **spatial.LOWERINGS, **attention.LOWERINGS}
"""Op name -> the lowering of an op with kernels of its own: `fn(lowering, op)`."""


class CudaCompileError(CodegenError):
    """NVRTC rejected the generated source; the message shows the line and its IR op."""


def emit_cuda(graph: Graph, sm_count: int = L.DEFAULT_SMS) -> str:
    """The CUDA C translation unit of every kernel `graph` lowers to."""
    return lower(graph, sm_count).source


def lower(graph: Graph, sm_count: int = L.DEFAULT_SMS) -> Program:
    """Plan storage, steps and source; UnsupportedOpError names the first op without a
    kernel (nn.* ops must be decomposed first)."""
    return Lowering(verify(graph), sm_count).run()


def _check(op_name: str, t) -> TensorType:
    if not isinstance(t, TensorType) or t.dtype not in CTYPE:
        raise UnsupportedOpError(f"the cuda backend does not support {t} (in '{op_name}'); "
                                 f"supported dtypes: {', '.join(CTYPE)}")
    return t


def _swaps_last_two(perm: list[int]) -> bool:
    r = len(perm)
    return r >= 2 and perm[:-2] == list(range(r - 2)) and perm[-2:] == [r - 1, r - 2]


class Lowering:
    """One graph's walk: `p` is the Program being built and `where` each value's slot; the
    op lowerings here and in LOWERINGS add slots and steps through `result`, `scratch`,
    `launch` and `gemm`."""

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
        a, b = _drop_broadcast(a), _drop_broadcast(b)
        out, a = _fold_rows(out, a, b)
        dtypes = tuple(self.p.slots[v.slot].type.dtype for v in (a, b, out))
        ex = None
        if cublas.low_precision(dtypes):
            ex = cublas.plan(out, a, b, dtypes)
            if ex is None:  # an operand cuBLAS cannot read in place: contiguous copies
                batch = out.shape[:-2]
                a, b = (self.packed(cublas.expanded(v, batch), d) for v, d in zip((a, b), dtypes))
                ex = cublas.plan(out, a, b, dtypes)
        self.p.steps.append(Gemm(out, a, b, self.op_index, ex))

    def packed(self, v: View, dtype: str) -> View:
        """`v` copied to contiguous scratch (by a map kernel) unless it is contiguous."""
        strides = tuple(contiguous_strides(v.shape))
        if v.strides == strides:
            return v
        slot = self.scratch(v.shape, dtype)
        k = map_kernel(f"k{self.op_index}_pack{slot}", v.shape, out_operands([dtype], v.shape),
                       [Operand(dtype, v.strides)], _identity, sm_count=self.sm)
        self.launch(k, [slot, v.slot])
        return View(slot, v.shape, strides)

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
        elif n in LOWERINGS:
            LOWERINGS[n](self, op)
        elif n == "kernel.fused":
            donor = self.fused_donor(op)
            if donor is None:
                outs = [self.result(r) for r in op.results]
            else:  # written in place over an operand that dies here
                outs = [self.where.setdefault(op.result, self.where[op.operands[donor]])]
            k = fused_kernel(self.name(op), op, restrict=donor is None, sm_count=self.sm)
            self.launch(k, outs + [self.where[v] for v in op.operands])
        elif n == "kernel.matmul":
            self.kernel_matmul(op)
        elif n in CONV_KERNELS:
            self.kernel_conv2d(op)
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

    def fused_donor(self, op: Operation) -> int | None:
        """An operand a `kernel.fused` may write its result over, as the cpu's arena does:
        one `in_place_operands` allows (ir/memory_plan.py: read at the index written, and
        only there), an op result in a slot of its own (not a reshape's, which another
        value shares) that no other op reads (so not a returned one either)."""
        for k in in_place_operands(op, [self.where[v] for v in op.operands]):
            v = op.operands[k]
            if (v.op is not None and v.op.name != "ember.reshape"
                    and self.p.slots[self.where[v]].kind == "temp"
                    and all(u is op for u, _ in v.uses)):
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
        product = accumulator_dtype(op)
        single = (len(outs) == 1 and tuple(at["out_maps"][0][:-1]) == contiguous
                  and at["out_types"][0].dtype == product)
        if single and not body.ops and list(body.yields) == [body.args[0]]:
            self.gemm(View(outs[0], out_space, contiguous), av, bv)  # no epilogue
            return
        acc = outs[0] if single else self.scratch(out_space, product)
        self.gemm(View(acc, out_space, contiguous), av, bv)
        self.epilogue(op, outs, acc, single)

    def kernel_conv2d(self, op: Operation) -> None:
        """The conv into the first result (where it is the conv's own layout and the only
        one) or scratch, then the epilogue as one map kernel."""
        outs = [self.result(r) for r in op.results]
        single = len(outs) == 1 and holds_product(op)
        acc = outs[0] if single else self.scratch(op.attributes["space"],
                                                  accumulator_dtype(op))
        (conv_into if op.name == "kernel.conv2d" else conv_nhwc_into)(self, op, acc)
        self.epilogue(op, outs, acc, single)

    def epilogue(self, op: Operation, outs: list[int], acc: int, in_place: bool) -> None:
        k = epilogue_kernel(self.name(op, "_epilogue"), op, restrict=not in_place,
                            sm_count=self.sm)
        self.launch(k, outs + [acc] + [self.where[v] for v in op.operands[2:]])

    # -- assembly ----------------------------------------------------------------------------
    def assemble(self) -> None:
        chunks, seen = [], set()
        for k, op_index in self.emitted:
            if k.name not in seen:
                seen.add(k.name)
                comment = self.p.ops[op_index].replace("\\", "/")  # no line splice
                chunks.append((k.name, op_index, f"// {comment}\n{k.source}\n"))
        body = "".join(c for _, _, c in chunks)
        head = [f"// ember: CUDA C for @{self.graph.name}, {len(self.emitted)} kernels "
                "(backends/cuda). Each kernel follows the IR op it implements.", PRELUDE,
                composed_definitions(body)]
        text = "\n".join(head) + "\n"
        line = text.count("\n") + 1
        for name, op_index, chunk in chunks:
            n = chunk.count("\n")
            self.p.kernels.append(KernelInfo(name, line, line + n - 2, op_index))  # to "}"
            line += n
        text += body
        self.p.source = text



def _drop_broadcast(v: View) -> View:
    """A GEMM operand that is the same matrix for every batch (batch dims of size 1 or
    stride 0) is passed unbatched, and matmul broadcasts it: no copy."""
    if len(v.shape) > 2 and all(d == 1 or s == 0 for d, s in zip(v.shape[:-2], v.strides)):
        return View(v.slot, v.shape[-2:], v.strides[-2:])
    return v


def _fold_rows(out: View, a: View, b: View) -> tuple[View, View]:
    """Batch dims that only continue the rows of A and C, with B one matrix for all (a
    Linear on [B, T, C]), become rows of one taller GEMM: one cuBLAS call. cupy's matmul
    of a batch against a broadcast matrix cost ~90 us of host time per call on an H200
    (the GPT's step: 39 such calls, 3.5 of its 5.8 ms)."""
    if len(b.shape) != 2:
        return out, a
    while len(a.shape) > 2 and all(v.strides[-3] == v.shape[-2] * v.strides[-2]
                                   for v in (a, out)):
        a, out = (View(v.slot, (*v.shape[:-3], v.shape[-3] * v.shape[-2], v.shape[-1]),
                       (*v.strides[:-3], v.strides[-2], v.strides[-1])) for v in (a, out))
    return out, a


def _identity(vals, i):
    return [], vals[:1]


def _single(name: str, attrs: dict, dtype: str):
    def body(vals, i):
        return [], [expr(name, attrs, vals, dtype)]
    return body
