"""`fuse`: group core ops into `kernel.fused` / `kernel.matmul` ops with scalar bodies.

Backend-neutral: it only decides which ops share one loop nest; the interpreter, cpu and
cuda backends all run the `kernel` dialect it produces (see `ir/dialects/kernel.py`).

Every fusible op has an iteration space (its result's shape, or its input's for a
reduction, without size-1 dims) and says which space dim each dim of its operands and
result runs along. Ops are visited in order; each starts as a group of its own and then
merges with the groups that produce its operands when one space embeds into the other
with those dims matching (the other dims are matched by size). That one rule fuses:
- elementwise and broadcast chains, and transposes / size-1 reshapes (relabelled dims);
- reductions with their producers (fuse on read) and with consumers of the reduced value
  that run over the same rows (fuse on write): a row softmax, log-softmax with its loss,
  or a layer norm is one kernel whose body reduces in phases;
- a matmul with elementwise consumers of its output (bias, activation, residual, the
  optimizer's update), which become its epilogue; a Linear on [B, T, C] (decomposed as a
  matmul on [B*T, C] and a reshape back) first gets a matmul of [B, T] rows, so its
  consumers join it like a Linear on rows (`unflatten_matmuls`);
- a conv (NCHW, or channels last: `kernel.conv2d_nhwc`) with elementwise consumers of its
  output, in a graph without a backward (inference: bias, activation, residual add), that
  read it in its own dim order (a consumer that transposes it runs as a kernel of its own).
Where to cut follows from the cost rules: a kernel reduces over one set of dims (a value
reduced along another axis is materialized and read by a second kernel); an epilogue
never reduces; two matmuls never share a kernel; nothing is recomputed — a value that
consumers outside its kernel read is stored as one more result of the kernel, and an op
whose value is stored never joins a kernel over dims it does not vary along (unless the
kernel reduces them: then it runs once per row, after the reduction); an
elementwise op that a reduction reads joins an epilogue only where that stores less (not
when what it reads there is stored anyway: a layer norm's backward reads dy and gamma, not
three products of them); and no merge may create a cycle between kernels. On a joint
training graph forward and backward ops never share a kernel (a copy the recompute pass
marks `ember.recompute` counts as backward, so it stays where the backward reads it, and
no forward kernel gains a result only the backward reads); on a recomputed graph
recomputed copies are grouped as the forward grouped their originals (so their kernels
repeat layer after layer, as the forward's do, and cost a backend no new function each),
and a backward merge is refused when the kernel would keep a value alive past its last
unfused reader while another op runs, or beside more bytes than its unstored temporaries
took, so fusing keeps the memory the strategy saved. Views (transpose, broadcast,
reshape) and splat constants are duplicated per use and folded into index maps and body
constants, so they are never copied.

In three steps: analysis.py describes each op (its space and dims), grouping.py merges
ops into groups, building.py replaces each group with its kernel op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...ir import Graph
from ...ir.memory_plan import backward_result_count, forward_ops
from ..manager import Pass, register_pass
from .attention import AttentionFuser
from .building import emit
from .grouping import Grouper, duplicate_views, unflatten_matmuls


@register_pass
@dataclass(frozen=True)
class Fuse(Pass):
    """Options: `epilogues` (fuse matmul consumers), `reductions` (fuse reductions),
    `attention` (softmax(q k^T) v and its backward as kernel.attention, attention.py)."""

    name: ClassVar[str] = "fuse"
    epilogues: bool = True
    reductions: bool = True
    attention: bool = True

    def apply(self, graph: Graph) -> Graph:
        if self.attention:
            AttentionFuser(graph.body).run()
        unflatten_matmuls(graph.body)
        duplicate_views(graph.body)
        inference = backward_result_count(graph) == 0
        groups = Grouper(graph.body, forward_ops(graph), self.epilogues, self.reductions,
                         conv_epilogues=inference).run()
        emit(graph.body, groups)
        return graph


__all__ = ["Fuse"]
