"""Graph -> LLVM module: a storage plan and one entry function that runs every op.

Each graph value that needs memory gets a slot: graph inputs and params (the caller's
arrays, set per call), constants (filled once at compile time), and op results
(preallocated once per compile). A reshape takes its operand's slot, since every buffer
is contiguous. Op results the graph does not return ("temp" slots that are not outputs)
live in one arena at the offsets of the memory planner (ir/memory_plan.py), run over
the kernel schedule with the in-place reuse the kernels really allow (`_reuse`); what the
graph returns gets buffers of its own, which the caller keeps. A kernel that needs working
memory (packed GEMM panels, products awaiting an epilogue) gets a "scratch" slot of its
own, in the arena too, alive only while the kernel runs. `ember_entry(ptr %buffers)` receives one
pointer per slot and calls the kernels in graph order, so one native call runs the whole
graph; one more pointer after the slots' is a bound call's guard (backends/cpu/call/binding.py) or
null, and the entry returns 1 where the guard refused the call, else 0.

`plan(graph)` is cheap and deterministic (no LLVM): a compile-cache hit reuses object
code and only needs the plan. `emit(plan)` builds the module.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from ...ir import Graph, Operation, TensorType, Value, numpy_dtype
from ...ir import memory_plan as mp
from ...ir.dialects.kernel_attention import ATTENTION_OPS
from ...ir.printer import print_graph
from ..errors import KernelCompileError, UnsupportedOpError
from ..input_checks import input_checks
from ..storage import Slot
from .attention.forward import attention_scratch, emit_attention
from .call.binding import emit_guard
from .call.input_checks import emit_checks
from .gemm.emit import pack_function
from .gemm.matmul import as_kernel, emit_matmul, packed_b, packed_bytes, scratch_bytes
from .kernels import scalar as S
from .kernels.conv import conv_scratch, emit_conv
from .kernels.depthwise_nhwc import depthwise_scratch, emit_depthwise_nhwc
from .kernels.dropout import emit_dropout
from .kernels.fused import emit_fused, fused_scratch
from .kernels.scalar import I64, PTR, REG, i64
from .kernels.spatial import emit_gather_scatter, emit_pool, status
from .kernels.unfused import ONE_OP_LOOPS, emit_kernel
from .machine.host import Isa, host_isa, num_threads

ENTRY = "ember_entry"
PROFILED = "ember_entry_profiled"  # (buffers, i64* ticks): the cycle counter after each kernel


@dataclass
class KernelCall:
    """One call of the entry: kernel function `name` on result slots `outs`, operand slots
    `ins` and, where the kernel needs working memory, slot `scratch`."""

    op: Operation
    outs: list[int]
    ins: list[int]
    name: str
    scratch: int | None = None  # slot index of its scratch buffer
    packed: int | None = None  # slot index of its GEMM's B, packed ahead of the call


@dataclass(frozen=True)
class Pack:
    """A param that a GEMM reads packed (`CONSTANT_PARAMS`): `PACK` writes its panels from
    slot `source` into slot `slot`, as the GEMM of step `step` reads them."""

    source: int
    slot: int
    step: int


@dataclass
class KernelPlan:
    """Every buffer's slot and the calls the entry makes, in order: all a compile-cache hit
    needs besides the object code."""

    slots: list[Slot] = field(default_factory=list)
    outputs: list[tuple[int, TensorType]] = field(default_factory=list)
    steps: list[KernelCall] = field(default_factory=list)
    arena: int = 0  # bytes of the arena
    checked: bool = False  # some kernel or input check reports in ember_status
    checks: list[tuple[int, int | None]] = field(default_factory=list)  # see call/input_checks.py
    threads: int = 1
    isa: Isa | None = None
    # a training step's (step, slot) of its loss: after that step the entry returns
    # LOSS_NOT_FINITE, running no later kernel, unless the loss is finite (`loss_check`)
    loss_check: tuple[int, int] | None = None
    packs: list[Pack] = field(default_factory=list)  # params GEMMs read packed, `PACK` k

    @functools.cached_property
    def readers_and_writers(self) -> tuple[dict[int, int], dict[int, int]]:
        """(slot -> the last call that reads it, slot -> the call that writes it), for the
        calls as planned (they do not change once planned)."""
        last = {i: n for n, st in enumerate(self.steps) for i in st.ins}
        writer = {o: n for n, st in enumerate(self.steps) for o in st.outs}
        return last, writer

    def scratch_bytes(self, op: Operation, packed: bool = False) -> int:
        """The working memory `op`'s kernel holds while it runs (packed GEMM panels, conv
        and attention tiles; 0: none), as this plan gives it: the memory planner's
        `scratch` (ir/memory_plan.py), so the plan of the graph counts it too. `packed`:
        its GEMM's B comes packed (`KernelCall.packed`)."""
        op = _gemm_form(op)
        if packed:
            return scratch_bytes(op, self.isa, self.threads, prepack=True)
        lowering = LOWERINGS.get(op.name)
        return lowering.scratch(op, self.isa, self.threads) if lowering and lowering.scratch \
            else 0


@dataclass
class Lowered:
    module: ir.Module
    plan: KernelPlan

    @property
    def slots(self):
        return self.plan.slots

    @property
    def outputs(self):
        return self.plan.outputs


def _check_type(op_name: str, t) -> TensorType:
    if not isinstance(t, TensorType) or t.dtype not in REG:
        raise UnsupportedOpError(f"the cpu backend does not support {t} (in '{op_name}'); "
                                 f"supported dtypes: {', '.join(REG)}")
    return t


def _gemm_form(op: Operation) -> Operation:
    """A float `ember.matmul` runs as the GEMM (`kernel.matmul`), not the naive loop nest."""
    if op.name == "ember.matmul" and op.result.type.dtype in ("f32", "f64"):
        return as_kernel(op)
    return op


# -- the lowering table: how each op runs on the cpu -------------------------------------
EmitBody = Callable[[ir.IRBuilder, "KernelCall", KernelPlan, list, list, ir.Value], None]


@dataclass(frozen=True)
class Lowering:
    """How the cpu runs one op: `emit` writes the body of its kernel function (result
    buffers, operand buffers, scratch); `scratch` sizes the working memory it holds while
    it runs (None: none); `in_place`: it may write its result over an operand
    (ir/memory_plan.py's rule); `reports`: it reports an out-of-range index in
    ember_status, so its code depends on its place in the schedule."""

    emit: EmitBody
    scratch: Callable[[Operation, Isa, int], int] | None = None
    in_place: bool = False
    reports: bool = False


def _one_op(b, st, p, outs, ins, scratch) -> None:
    b.call(emit_kernel(b.module, st.name + ".op", st.op), outs + ins)


def _fused(b, st, p, outs, ins, scratch) -> None:
    emit_fused(b, st.op, outs, ins, p.threads, st.name, scratch)


def _matmul(b, st, p, outs, ins, scratch) -> None:
    """A GEMM and its epilogue; a packed B's panels come after the operands."""
    packed = ins.pop() if st.packed is not None else None
    emit_matmul(b, st.op, outs, ins, scratch, p.isa, p.threads, st.name, packed)


def _with_scratch(emit) -> EmitBody:
    """An emitter taking (op, outs, ins, scratch, isa, threads, name): GEMMs, convs,
    attention."""
    def body(b, st, p, outs, ins, scratch) -> None:
        emit(b, st.op, outs, ins, scratch, p.isa, p.threads, st.name)
    return body


def _pool(b, st, p, outs, ins, scratch) -> None:
    emit_pool(b, st.op, outs, ins, p.threads, st.name)


def _gather_scatter(b, st, p, outs, ins, scratch) -> None:
    emit_gather_scatter(b, st.op, outs, ins, p.steps.index(st))


def _dropout(b, st, p, outs, ins, scratch) -> None:
    emit_dropout(b, st.op, outs, ins)


LOWERINGS: dict[str, Lowering] = {
    **dict.fromkeys(ONE_OP_LOOPS, Lowering(_one_op, in_place=True)),
    "kernel.fused": Lowering(_fused, lambda op, isa, threads: fused_scratch(op, threads),
                             in_place=True),
    "kernel.matmul": Lowering(_matmul, scratch_bytes),
    **dict.fromkeys(("ember.conv2d", "ember.conv2d_grad_input", "ember.conv2d_grad_weight",
                     "kernel.conv2d"),
                    Lowering(_with_scratch(emit_conv), conv_scratch)),
    **dict.fromkeys(("ember.conv2d_nhwc", "kernel.conv2d_nhwc"),
                    Lowering(_with_scratch(emit_depthwise_nhwc), depthwise_scratch)),
    **dict.fromkeys(ATTENTION_OPS, Lowering(_with_scratch(emit_attention), attention_scratch)),
    **dict.fromkeys(("ember.max_pool2d", "ember.max_pool2d_grad", "ember.avg_pool2d",
                     "ember.avg_pool2d_grad"), Lowering(_pool)),
    **dict.fromkeys(("ember.gather", "ember.scatter_add"), Lowering(_gather_scatter,
                                                                   reports=True)),
    "ember.dropout": Lowering(_dropout),
}


def plan(graph: Graph, threads: int | None = None) -> KernelPlan:
    """Storage and the kernel schedule; UnsupportedOpError names the first op without a
    kernel. In a graph marked `CONSTANT_PARAMS`, a GEMM whose B is a param reads it packed
    (`_packed_slot`)."""
    out = KernelPlan(threads=threads or num_threads(), isa=host_isa())
    constant = bool(graph.attributes.get(CONSTANT_PARAMS))
    packed: dict[tuple, int] = {}  # (param slot, layout) -> its packed slot
    where: dict[Value, int] = {}
    owner: list[Value] = []  # the value each slot was made for

    def new_slot(v: Value, kind: str, **kw) -> int:
        where[v] = len(out.slots)
        owner.append(v)
        out.slots.append(Slot(kind, _check_type("graph argument", v.type), **kw))
        return where[v]

    for i, a in enumerate(graph.args):
        new_slot(a, "arg", key=i, path=f"%{a.name}" if a.name else "")
    for k, op in enumerate(graph.ops):
        for v in op.operands:
            _check_type(op.name, v.type)
        if op.name == "func.return":
            out.outputs = [(where[v], v.type) for v in op.operands]
        elif op.name == "ember.param":
            new_slot(op.result, "param", key=op.attributes["id"],
                     path=op.attributes.get("path", ""))
        elif op.name == "ember.constant":
            t = op.result.type
            value = np.asarray(op.attributes["value"], dtype=numpy_dtype(t.dtype))
            new_slot(op.result, "const", value=value.reshape(t.shape))
        elif op.name == "ember.reshape":
            _check_type(op.name, op.result.type)
            where[op.result] = where[op.operands[0]]
        elif op.name in LOWERINGS:
            orig, op = op, _gemm_form(op)
            outs = [new_slot(r, "temp") for r in op.results]
            for old, new in zip(orig.results, op.results):
                where[old] = where[new]
            short = op.name.split(".", 1)[1]
            st = KernelCall(op, outs, [where[v] for v in orig.operands], f"k{k}_{short}")
            if constant and op.name == "kernel.matmul":
                st.packed = _packed_slot(out, st, packed, owner)
            n = out.scratch_bytes(op, st.packed is not None)
            if n:
                st.scratch = len(out.slots)
                owner.append(mp.Scratch.of(n))
                out.slots.append(Slot("scratch", owner[-1].type, key=n))
            out.steps.append(st)
        else:
            raise UnsupportedOpError(
                f"the cpu backend has no kernel for '{op.name}': it runs core ember.* ops "
                "and kernel.* ops only; run the `decompose` pass first (it lowers nn.* ops "
                "to them)")
    out.checks = input_checks(graph)
    for arg, bound, _ in out.checks:
        want = ("f32", "f64") if bound is None else ("i32", "i64")
        if graph.args[arg].type.dtype not in want:
            raise UnsupportedOpError(f"input check on argument {arg} of {graph.args[arg].type}:"
                                     f" needs {' or '.join(want)}")
    out.checked = bool(out.checks) or any(LOWERINGS[st.op.name].reports for st in out.steps)
    out.loss_check = loss_check(graph, out)
    _place_temps(out, owner)
    return out


# graph attribute: the params are read-only and keep their values from call to call unless
# the caller binds other arrays or says so (an inference graph: runtime/compiled.py)
CONSTANT_PARAMS = "ember.constant_params"


def _packed_slot(p: KernelPlan, st: KernelCall, packed: dict, owner: list) -> int | None:
    """The slot of the GEMM's B packed ahead of the call, where B is a param and the GEMM
    would pack it (gemm/matmul.py `packed_b`): packed once when bound rather than on every
    call (a cold [768, 768] weight's packing was ~25% of its GEMM with 128 rows); a param
    read the same way by several GEMMs is packed once for all."""
    source = st.ins[1]
    if p.slots[source].kind != "param":
        return None
    prob = packed_b(st.op, p.isa, p.threads)
    if prob is None:
        return None
    key = (source, prob.k, prob.n, prob.sb_k, prob.sb_n)
    if key not in packed:
        n = packed_bytes(prob, p.isa, p.threads) // S.size(prob.dtype)
        packed[key] = len(p.slots)
        owner.append(None)  # a buffer of its own, outside the arena
        p.slots.append(Slot("packed", TensorType((n,), prob.dtype), key=source))
        p.packs.append(Pack(source, packed[key], len(p.steps)))
    return packed[key]


def loss_check(graph: Graph, p: KernelPlan) -> tuple[int, int] | None:
    """Where a training step (a graph with `ember.updates`) computes its loss (its first
    result, a float scalar): (the step, the loss's slot). Kernels after it may update the
    params in place (call/bound.py), so a loss that is not finite stops the entry there:
    the runtime raises with the params as they were."""
    if "ember.updates" not in graph.attributes or not p.outputs:
        return None
    slot, t = p.outputs[0]
    if t.shape != () or t.dtype not in ("f32", "f64"):
        return None
    step = next((n for n, st in enumerate(p.steps) if slot in st.outs), None)
    return None if step is None else (step, slot)


def _place_temps(p: KernelPlan, owner: list[Value]) -> None:
    """Arena offsets of the temp slots that the graph does not return, planned over the
    kernel schedule (a slot's lifetime covers every value that shares it)."""
    returned = {i for i, _ in p.outputs}
    steps = [mp.Step(st.op.name, [owner[i] for i in st.ins],
                     [owner[i] for i in st.outs if i not in returned]
                     + ([owner[st.scratch]] if st.scratch is not None else []),
                     reuse=_reuse(st, owner))
             for st in p.steps]
    memory = mp.plan(steps, {}, ())
    slot = {v: i for i, v in enumerate(owner)}
    for v, off in memory.offsets.items():
        p.slots[slot[v]].offset = off
    p.arena = memory.arena_bytes


def _reuse(st: KernelCall, owner: list[Value]) -> list[Value]:
    """The operands a kernel may write its result over (ir/memory_plan.py's rule, by slot).
    Their arguments keep `noalias`: a store depends on the loads at its own index, so no
    reordering LLVM may do moves it before them, and no other index is shared."""
    if not LOWERINGS[st.op.name].in_place:
        return []
    return [owner[st.ins[k]] for k in mp.in_place_operands(st.op, st.ins)]


def _kernel_key(st: KernelCall, index: int) -> tuple:
    """What a kernel function's code depends on: the op as printed, its values renamed in
    order of appearance (a parsed graph keeps the names its text gave them), whether it
    has scratch, and for gather/scatter the step index (its out-of-range status code)."""
    names: dict[str, str] = {}
    text = _VALUE.sub(lambda m: names.setdefault(m.group(), f"%{len(names)}"), _op_text(st.op))
    return (text, st.scratch is not None, st.packed is not None,
            index if LOWERINGS[st.op.name].reports else None)


_VALUE = re.compile(r"%[A-Za-z0-9_$.\-]+(?:#\d+)?")


def _op_text(op: Operation) -> str:
    """The op as printed IR (for error messages)."""
    g = Graph("failing_op", [v.type for v in op.operands])
    clone = Operation(op.name, list(g.args), [r.type for r in op.results],
                      dict(op.attributes))
    clone.regions = op.regions
    g.body.append(clone)
    try:
        return print_graph(g).split("\n", 2)[2].rsplit("\n", 3)[0].strip()
    except Exception:  # noqa: BLE001  (printing is best effort here)
        return op.name


def kernel_count(p: KernelPlan) -> int:
    """How many kernel functions `emit` makes of a plan (steps that print the same share
    one): what LLVM's compile time grows with."""
    return len({_kernel_key(st, k) for k, st in enumerate(p.steps)})


def emit(p: KernelPlan, name: str = "graph") -> ir.Module:
    """The LLVM module of a plan: one function per distinct kernel and the entry.

    Steps whose ops print the same (op, attributes, operand and result types, fused body)
    share one function, called with each step's buffers: the layers of a deep model repeat
    their kernels, and LLVM optimizes each once (its optimize+codegen is most of a first
    compile)."""
    mod = ir.Module(name=name)
    fns, made = [], {}
    for k, st in enumerate(p.steps):
        key = _kernel_key(st, k)
        if key in made:
            fns.append(made[key])
            continue
        try:
            fns.append(made.setdefault(key, _kernel_function(mod, st, p)))
        except (UnsupportedOpError, KernelCompileError):
            raise
        except Exception as e:  # noqa: BLE001  (name the op whatever went wrong)
            raise KernelCompileError(f"the cpu backend failed to generate code for "
                                     f"{st.name}:\n  {_op_text(st.op)}\n{type(e).__name__}: "
                                     f"{e}") from e
    guard = emit_guard(mod)
    if p.packs:
        _emit_packer(mod, p)
    for name_, profiled in ((ENTRY, False), (PROFILED, True)):
        entry = ir.Function(mod, ir.FunctionType(I64, [PTR] * (1 + profiled)), name_)
        entry.args[0].name = "buffers"
        entry.args[0].add_attribute("noalias")
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        if not profiled:  # which may bind inputs: before the slots are read
            _emit_guard_call(b, guard, entry.args[0], len(p.slots))
        if p.checks:
            ptrs = _pointers(b, entry.args[0], sorted({arg for arg, *_ in p.checks}))
            emit_checks(b, p.checks, [ptrs[arg] for arg, *_ in p.checks],
                        [p.slots[arg].type for arg, *_ in p.checks], status(mod), p.threads)
        if profiled:
            _stamp(b, entry.args[1], 0)
        for k, (first, last) in enumerate(_segments(p)):
            part = _segment(mod, p, fns, first, last, f"{name_}.part{k}", profiled)
            b.call(part, list(entry.args))
            if p.loss_check is not None and last == p.loss_check[0] + 1:
                _emit_loss_check(b, entry.args[0], p.loss_check[1], p.slots[p.loss_check[1]])
        b.ret(i64(0))
    return mod


LOSS_NOT_FINITE = 2  # what the entry returns when `loss_check` stopped it (1: the guard's)
PACK = "ember_pack"  # (buffers, i64 k): pack `plan.packs[k]`'s param from its slot


def _emit_packer(mod: ir.Module, p: KernelPlan) -> None:
    """`PACK(buffers, k)`: the panels of `p.packs[k]` written from its param's buffer; one
    packing function per layout, shared by the params of that shape."""
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR, I64]), PACK)
    buffers, k = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    done = fn.append_basic_block("done")
    switch = b.switch(k, done)
    made: dict[tuple, ir.Function] = {}
    for j, pk in enumerate(p.packs):
        prob = packed_b(p.steps[pk.step].op, p.isa, p.threads)
        key = (prob.k, prob.n, prob.sb_k, prob.sb_n, prob.dtype)
        if key not in made:
            made[key] = pack_function(mod, prob, p.isa, p.threads, f"{PACK}.{len(made)}")
        case = fn.append_basic_block(f"pack{j}")
        switch.add_case(i64(j), case)
        b.position_at_end(case)
        ptrs = _pointers(b, buffers, (pk.source, pk.slot))
        b.call(made[key], [ptrs[pk.source], ptrs[pk.slot]])
        b.branch(done)
    b.position_at_end(done)
    b.ret_void()


def _segments(p: KernelPlan) -> list[tuple[int, int]]:
    """[first, last) of each segment: SEGMENT steps, and a cut right after the loss's step
    (`loss_check`)."""
    cuts = set(range(0, len(p.steps), SEGMENT)) | {len(p.steps)}
    if p.loss_check is not None:
        cuts.add(p.loss_check[0] + 1)
    bounds = sorted(cuts)
    return list(zip(bounds, bounds[1:]))


def _emit_loss_check(b: ir.IRBuilder, buffers: ir.Value, slot: int, s: Slot) -> None:
    """Return LOSS_NOT_FINITE unless the float in slot `slot` is finite (|x| < inf: NaN
    compares false)."""
    dt = s.type.dtype
    ptr = b.load(b.gep(buffers, [i64(slot)], inbounds=True, source_etype=PTR), typ=PTR)
    x = b.load(ptr, typ=S.REG[dt])
    magnitude = S.intrinsic(b, f"llvm.fabs.{dt}", S.REG[dt], [x], flags=())
    finite = b.fcmp_ordered("<", magnitude, S.const(dt, float("inf")))
    stop, go = b.append_basic_block("loss.not_finite"), b.append_basic_block("loss.finite")
    b.cbranch(finite, go, stop)
    b.position_at_end(stop)
    b.ret(i64(LOSS_NOT_FINITE))
    b.position_at_end(go)


# steps per segment of the entry: one function calling thousands of kernels, every buffer
# pointer live throughout, made LLVM's codegen superlinear (a 500-layer MLP's training step:
# 4.9 s of a 6 s compile); segments of this many keep each function small
SEGMENT = 64


def _pointers(b: ir.IRBuilder, buffers: ir.Value, slots) -> dict[int, ir.Value]:
    """The buffer pointers of `slots`, loaded before any kernel of the function runs (so no
    store can change them)."""
    return {i: b.load(b.gep(buffers, [i64(i)], inbounds=True, source_etype=PTR), typ=PTR,
                      name=f"buf{i}") for i in slots}


def _segment(mod: ir.Module, p: KernelPlan, fns: list, first: int, last: int, name: str,
             profiled: bool) -> ir.Function:
    """`name(buffers[, ticks])`: steps [first, last) of the plan in order, each a call of
    its kernel function on its buffers (a cycle stamp after each, profiled)."""
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR] * (1 + profiled)), name)
    fn.linkage = "internal"
    fn.attributes.add("noinline")  # inlined back, the entry would be one function again
    fn.args[0].add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    steps = list(enumerate(zip(p.steps[first:last], fns[first:last]), first))
    used = {s for _, (st, _) in steps for s in (*st.outs, *st.ins, st.scratch, st.packed)
            if s is not None}
    ptrs = _pointers(b, fn.args[0], sorted(used))
    for k, (st, kernel) in steps:
        scratch = ptrs[st.scratch] if st.scratch is not None else ir.Constant(PTR, None)
        b.call(kernel, [ptrs[s] for s in st.outs + st.ins + _packed(st)] + [scratch])
        if profiled:
            _stamp(b, fn.args[1], k + 1)
    b.ret_void()
    return fn


def _emit_guard_call(b: ir.IRBuilder, guard: ir.Function, buffers: ir.Value,
                     slot: int) -> None:
    """Where the guard slot holds a guard (a bound call's, backends/cpu/call/binding.py) that
    refuses the call: return 1 before any kernel runs."""
    table = b.load(b.gep(buffers, [i64(slot)], inbounds=True, source_etype=PTR), typ=PTR)
    check, refused, run = (b.append_basic_block(f"guard.{s}")
                           for s in ("check", "refused", "passed"))
    b.cbranch(b.icmp_unsigned("!=", b.ptrtoint(table, I64), i64(0)), check, run)
    b.position_at_end(check)
    b.cbranch(b.icmp_unsigned("!=", b.call(guard, [table, buffers]), i64(0)), refused, run)
    b.position_at_end(refused)
    b.ret(i64(1))
    b.position_at_end(run)


def _stamp(b: ir.IRBuilder, ticks: ir.Value, k: int) -> None:
    """ticks[k] = the CPU's cycle counter."""
    clock = S.declare(b.module, "llvm.readcyclecounter", S.I64, [])
    b.store(b.call(clock, []), b.gep(ticks, [i64(k)], inbounds=True, source_etype=S.I64))


def _packed(st: KernelCall) -> list[int]:
    """The packed B a kernel reads after its operands (none or one slot)."""
    return [] if st.packed is None else [st.packed]


def _kernel_function(mod: ir.Module, st: KernelCall, p: KernelPlan) -> ir.Function:
    op = st.op
    nargs = len(st.outs) + len(st.ins) + len(_packed(st))
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [PTR] * (nargs + 1)), st.name)
    fn.linkage = "internal"
    fn.attributes.add("noinline")  # one copy per distinct kernel, not one per call site
    for k, a in enumerate(fn.args):
        a.name = (f"out{k}" if k < len(st.outs) else f"in{k - len(st.outs)}" if k < nargs
                  else "scratch")
        if k < len(st.outs) or k == nargs:
            a.add_attribute("noalias")
    outs, ins, scratch = fn.args[:len(st.outs)], fn.args[len(st.outs):nargs], fn.args[nargs]
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    LOWERINGS[op.name].emit(b, st, p, list(outs), list(ins), scratch)
    b.ret_void()
    return fn


def lower(graph: Graph, threads: int | None = None) -> Lowered:
    p = plan(graph, threads)
    return Lowered(emit(p, graph.name), p)


__all__ = ["CONSTANT_PARAMS", "ENTRY", "LOSS_NOT_FINITE", "LOWERINGS", "PACK", "PROFILED",
           "KernelCall", "KernelPlan", "Lowered", "Lowering", "Pack", "S", "Slot", "emit",
           "kernel_count", "loss_check", "lower", "plan"]
