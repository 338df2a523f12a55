"""The allreduce of the cuda backend: no kernel, one `program.HostAllReduce` step from the
operand's slot into the result's (copied to the host, summed across ranks by
backends/collectives.py, copied back; one process: a copy). `ember.grads_ready` is its
token alone, a constant: a device step reduces its gradients after the run (the runtime
buckets them on host backends only, runtime/data_parallel.py).
"""

from __future__ import annotations

import numpy as np

from ...ir import Operation
from .program import HostAllReduce


def _allreduce(lw, op: Operation) -> None:
    lw.p.steps.append(HostAllReduce(lw.result(op.result), lw.where[op.operands[0]],
                                    lw.op_index))


def _grads_ready(lw, op: Operation) -> None:
    lw.where[op.result] = lw.slot("const", op.result.type,
                                  value=np.array(op.attributes["bucket"], np.int64))


LOWERINGS = {"ember.allreduce": _allreduce, "ember.grads_ready": _grads_ready}
