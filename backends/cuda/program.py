"""What the cuda backend lowers a graph to: a `Program` of buffer slots, steps (kernel
launches, cuBLAS GEMMs, memsets) and one CUDA C source with a line -> op map; and the
arena plan that places its results and scratch.

Each graph value that needs memory gets a slot: graph inputs and params (bound per
call), constants (uploaded once), op results and scratch (im2col columns, reduction
partials, GEMM accumulators). Results and scratch live in ONE arena allocated once, at
the offsets of the memory planner every backend uses (ir/memory_plan.py): each slot lives
from the first step that touches it to the last, and slots whose lifetimes do not overlap
share bytes. Results the graph returns are allocated fresh per call (the caller keeps
them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...ir import TensorType
from ...ir import memory_plan as mp
from ..storage import Slot
from . import launch as L


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


@dataclass(frozen=True)
class Matrix:
    """One operand of a GemmEx as cuBLAS reads it: `op` (cublas.OP_N or OP_T) of the
    column-major matrix of `ld` elements per column, the next batch `stride` elements on
    (0: the same matrix)."""

    slot: int
    dtype: str
    op: int
    ld: int
    stride: int


@dataclass(frozen=True)
class GemmEx:
    """One cublasGemmStridedBatchedEx call (planned by cublas.py): C (m x n, column-major)
    = op(A) op(B) over `batch` matrices, sums in f32."""

    m: int
    n: int
    k: int
    batch: int
    a: Matrix
    b: Matrix
    c: Matrix


@dataclass
class Gemm:
    """out = a @ b through cuBLAS (numpy matmul broadcasting over batch dims): cupy's
    matmul, or on bf16/f16 operands with f32 sums the planned cublasGemmStridedBatchedEx
    call `ex` (cublas.py)."""

    out: View
    a: View
    b: View
    op: int
    ex: GemmEx | None = None


@dataclass
class Memset:
    slot: int
    op: int


@dataclass
class HostAllReduce:
    """out = the allreduce of src (`ember.allreduce`): copied to the host, summed across
    ranks by backends/collectives.py, copied back; one process: out = src."""

    out: int
    src: int
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


# -- the arena plan ----------------------------------------------------------------------------

def step_slots(step) -> list[int]:
    """The slots a step reads or writes."""
    if isinstance(step, Launch):
        return list(step.args)
    if isinstance(step, Gemm):
        return [step.out.slot, step.a.slot, step.b.slot]
    if isinstance(step, HostAllReduce):
        return [step.out, step.src]
    return [step.slot]


def plan_arena(p: Program) -> None:
    """Offsets in one arena, from the memory planner (ir/memory_plan.py) that plans every
    backend's arena, for every temp and scratch slot but the returned ones. A slot lives
    from the first step that touches it to the last (scratch is written by one step and
    read by the next, so "touches" is all the planner needs); where a kernel writes over
    its operand (an epilogue, a `kernel.fused` by the planner's `in_place_operands`) the
    lowering already gave both one slot, so the planner reuses nothing more (`reuse=[]`).
    Buffers are 256-byte aligned, as cuBLAS and vector loads want."""
    returned = {i for i, _ in p.outputs}
    arena = [s for i, s in enumerate(p.slots)
             if s.kind in ("temp", "scratch") and i not in returned]
    planned, seen = set(arena), set()
    steps = []
    for step in p.steps:
        touched = [p.slots[i] for i in dict.fromkeys(step_slots(step))
                   if p.slots[i] in planned]
        first = [s for s in touched if s not in seen]
        seen.update(first)
        steps.append(mp.Step(type(step).__name__, [s for s in touched if s not in first],
                             first, reuse=[]))
    memory = mp.plan(steps, {}, (), align=L.ALIGN)
    for s in arena:
        s.offset = memory.offsets[s]
    p.arena_bytes = memory.arena_bytes
