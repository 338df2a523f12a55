"""The numpy interpreter: runs any graph of registered ops, op by op.

It is the reference every other backend is tested against, and the fallback that
runs anything the IR can express. An op on bf16 or f16 values computes in f32 and rounds
its results (ir/precision.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...ir import Graph, Operation, numpy_dtype, verify
from ...ir.precision import rounded, widened
from ..errors import UnsupportedOpError
from .fused import FUSED
from .reference import KERNELS


def evaluate(op: Operation, args: list[np.ndarray], params: Mapping[str, np.ndarray]) -> list:
    """Compute one op's results from its operands' values. An Inf or NaN result is the
    op's meaning (as in IEEE arithmetic and the compiled backends), so numpy's warnings
    about them are silenced: `detect_anomaly` is how a user asks where one came from."""
    with np.errstate(all="ignore"):
        return _evaluate(op, args, params)


def _evaluate(op: Operation, args: list[np.ndarray], params: Mapping[str, np.ndarray]) -> list:
    if op.name == "ember.param":
        pid = op.attributes["id"]
        if pid not in params:
            raise KeyError(f"no value for param {op.attributes.get('path', '')} (id {pid})")
        values = [params[pid]]
    elif op.name in FUSED:
        values = FUSED[op.name](op, *map(widened, args))
    elif op.name in KERNELS:
        out = KERNELS[op.name](op.attributes, *map(widened, args))
        values = list(out) if len(op.results) != 1 else [out]  # multi-result: a tuple
    else:
        raise UnsupportedOpError(f"the interpreter has no kernel for '{op.name}'")
    return [np.ascontiguousarray(rounded(v, r.type.dtype)).reshape(r.type.shape)
            for v, r in zip(values, op.results)]


class Executable:
    """A graph ready to run on numpy arrays."""

    def __init__(self, graph: Graph):
        self.graph = verify(graph)

    def __call__(self, inputs: Sequence[np.ndarray],
                 params: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        params = params or {}
        if len(inputs) != len(self.graph.args):
            raise ValueError(f"graph @{self.graph.name} takes {len(self.graph.args)} inputs, "
                             f"got {len(inputs)}")
        env = {}
        for arg, x in zip(self.graph.args, inputs):
            env[arg] = np.asarray(x, dtype=numpy_dtype(arg.type.dtype))
        for op in self.graph.ops:
            if op.name == "func.return":
                return [env[v] for v in op.operands]
            for r, v in zip(op.results, evaluate(op, [env[a] for a in op.operands], params)):
                env[r] = v
        raise ValueError("graph has no func.return")


def compile(graph: Graph) -> Executable:  # noqa: A001  (the backend interface's name)
    return Executable(graph)


def run(graph: Graph, inputs: Sequence[np.ndarray],
        params: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """Interpret `graph` once."""
    return Executable(graph)(inputs, params)
