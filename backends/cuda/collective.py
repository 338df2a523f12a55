"""The allreduce of the cuda backend: no kernel, one `program.HostAllReduce` step from the
operand's slot into the result's (copied to the host, summed across ranks by
backends/collectives.py, copied back; one process: a copy).
"""

from __future__ import annotations

from ...ir import Operation
from .program import HostAllReduce


def _allreduce(lw, op: Operation) -> None:
    lw.p.steps.append(HostAllReduce(lw.result(op.result), lw.where[op.operands[0]],
                                    lw.op_index))


LOWERINGS = {"ember.allreduce": _allreduce}
