"""Finding the op behind a failure: the graph is rerun op by op on the numpy interpreter.

A compiled step that raises, or that produces NaN/Inf under `detect_anomaly`, is replayed
here on the same inputs and params; the message names the IR op, its result and the
source line of the forward that created it (the op's `loc`). `explain` and `check_finite`
are what a compiled object (runtime/compiled.py) calls after a run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..backends import interpreter
from ..backends.input_checks import InputCheckError
from ..ir import Graph, Operation, Value, is_float, numpy_dtype
from .backend import to_host


class ExecutionError(RuntimeError):
    """An op of a compiled graph failed; the message names the op and its source line."""


class AnomalyError(FloatingPointError):
    """NaN or Inf appeared; the message names the first op that produced it."""


def describe(op: Operation) -> str:
    """`'ember.log' (result %12 : tensor<32x10xf32>) at model.py:23`."""
    where = f" at {op.loc.file}:{op.loc.line}" if op.loc is not None else " (no source location)"
    result = f" -> {', '.join(str(r.type) for r in op.results)}" if op.results else ""
    path = op.attributes.get("path")
    return f"'{op.name}'{result}{f' [{path}]' if path else ''}{where}"


def _env(graph: Graph, inputs: Sequence[np.ndarray]) -> dict[Value, np.ndarray]:
    return {a: np.asarray(x, dtype=numpy_dtype(a.type.dtype)) for a, x in zip(graph.args, inputs)}


def replay(graph: Graph, inputs: Sequence[np.ndarray],
           params: Mapping[str, np.ndarray]) -> Iterator[tuple[Operation, list, list]]:
    """(op, operand values, result values) for each op in order; an op's error propagates."""
    env = _env(graph, inputs)
    for op in graph.ops:
        if op.name == "func.return":
            return
        args = [env[a] for a in op.operands]
        results = interpreter.evaluate(op, args, params)
        env.update(zip(op.results, results))
        yield op, args, results


def locate_error(graph: Graph, inputs, params) -> tuple[Operation, Exception] | None:
    """The first op that raises when the graph is interpreted, with its exception."""
    env = _env(graph, inputs)
    with np.errstate(all="ignore"):
        for op in graph.ops:
            if op.name == "func.return":
                break
            try:
                env.update(zip(op.results, interpreter.evaluate(op, [env[a] for a in op.operands],
                                                                params)))
            except Exception as e:  # noqa: BLE001  (any kernel error is what we look for)
                return op, e
    return None


def _bad(a: np.ndarray) -> bool:
    return is_float(a.dtype) and not np.isfinite(a).all()


def _what(a: np.ndarray) -> str:
    n_nan, n_inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
    return ", ".join(s for s in (f"{n_nan} NaN" if n_nan else "", f"{n_inf} Inf" if n_inf else "")
                     if s) + f" of {a.size} elements"


def find_anomaly(graph: Graph, inputs, params) -> str | None:
    """Where NaN/Inf first appears: a non-finite input or param, or the first op whose
    results are non-finite although its operands are all finite."""
    for a, x in zip(graph.args, inputs):
        x = np.asarray(x)
        if _bad(x):
            return f"input %{a.name or a.index} contains {_what(x)}"
    with np.errstate(all="ignore"):
        for op, args, results in replay(graph, inputs, params):
            bad = [i for i, r in enumerate(results) if _bad(r)]
            if not bad:
                continue
            if op.name == "ember.param":
                return f"param {op.attributes.get('path')} already contains {_what(results[0])}"
            if any(_bad(a) for a in args):  # inherited from an operand: reported earlier
                continue
            stats = ", ".join(f"operand {i}: [{a.min():.3g}, {a.max():.3g}]"
                              for i, a in enumerate(args) if is_float(a.dtype) and a.size)
            return (f"{describe(op)} produced {_what(results[bad[0]])} from finite operands"
                    + (f" ({stats})" if stats else ""))
    return None


def explain(error: Exception, entry: Any, args: list, params: dict, kind: str,
            check_inputs: Callable[[tuple], None]) -> None:
    """Raise what says why a run of `entry` (a compiled graph, runtime/compiled.py's Entry)
    of the compiled `kind` on `args` and `params` failed with `error`, where more can be
    said than `error` does: for a backend's own input check, whatever `check_inputs` (the
    checks in Python) raises on the inputs; else an ExecutionError naming the op and source
    line that fails on the interpreter. Returns where it finds nothing to add."""
    if isinstance(error, InputCheckError):
        check_inputs(tuple(args[:len(entry.specs)]))
        return
    found = locate_error(entry.replay_graph(), args, params)
    if found is not None:
        op, cause = found
        raise ExecutionError(f"{kind} failed in {describe(op)}: "
                             f"{type(cause).__name__}: {cause}") from error


def check_finite(outs: list, entry: Any, args: list, params: dict, what: str,
                 backend: str) -> None:
    """An AnomalyError where a result in `outs` of a run of `entry` on `args` and `params`
    (on the `backend` named) holds NaN/Inf, tracing it to the op behind it; `what` names
    the run (`train_step at step 3`)."""
    outs = [to_host(o) for o in outs]
    if not any(_bad(o) for o in outs):
        return
    where = (find_anomaly(entry.replay_graph(), args, params)
             or f"the interpreter found none (the {backend} backend differs)")
    raise AnomalyError(f"NaN/Inf in the results of {what}: "
                       f"{where}; the model's params were not updated")


__all__ = ["AnomalyError", "ExecutionError", "check_finite", "describe", "explain",
           "find_anomaly", "locate_error", "replay"]
