"""The I/O of a lowered optimizer update, and `opt.step` for hand-written loops.

`opt.step(model, grads)` builds a small graph of ember.param ops and gradient inputs,
lowers it with the same `optimizer` pass a compiled step uses, and runs it, so a hand
loop and a compiled step apply bit-for-bit the same formulas.
"""

from __future__ import annotations

import numpy as np

from ..backends import interpreter
from ..ir import Builder, Graph, TensorType, numpy_dtype
from ..passes.manager import parse_pipeline
from .backend import to_host
from .params import param_table, param_values


def hyper_inputs(opt, dtype: str) -> list[np.ndarray]:
    """The `lr` and `step` arguments of a lowered update."""
    dt = numpy_dtype(dtype)
    return [np.asarray(opt.lr, dtype=dt), np.asarray(opt.step_count + 1, dtype=dt)]


def state_inputs(opt, graph: Graph, table: dict) -> list[np.ndarray]:
    out = []
    for name in graph.attributes["ember.state"]:
        pid, slot = name.rsplit(":", 1)
        out.append(opt.slot(table[pid].id, slot, table[pid].val()))
    return out


def write_back(opt, graph: Graph, table: dict, outs: list, keep=None) -> None:
    """Store the new params and optimizer state a lowered update returned; count the step.

    Params are rebound to the returned arrays (brought to the host when they are device
    arrays; `keep(pid, host, device)` lets the caller keep the device copy); optimizer
    state stays where the backend put it.
    """
    updates, state = graph.attributes["ember.updates"], graph.attributes["ember.state"]
    new = outs[len(outs) - len(updates) - len(state):]
    for pid, value in zip(updates, new):
        table[pid].set_value(to_host(value))
        if keep is not None:
            keep(pid, table[pid].val(), value)
    for name, value in zip(state, new[len(updates):]):
        pid, slot = name.rsplit(":", 1)
        opt.state[table[pid].id][slot] = value
    opt.step_count += 1


def apply_update(opt, model, grads) -> None:
    table = param_table(model)
    ids = [pid for pid, p in table.items() if p.id in grads and p.requires_grad]
    if not ids:
        return
    dtype = table[ids[0]].dtype
    graph = Graph("update", [TensorType(table[pid].shape, table[pid].dtype) for pid in ids])
    b = Builder(graph.body)
    for pid in ids:
        b.create("ember.param", [], {"id": pid, "path": pid},
                 result_types=[TensorType(table[pid].shape, table[pid].dtype)])
    b.create("func.return", list(graph.args))
    graph.attributes["ember.grads"] = ids
    (lower,) = parse_pipeline(opt.pass_spec())
    graph = lower.apply(graph)
    inputs = [grads[table[pid].id] for pid in ids]
    inputs += hyper_inputs(opt, dtype) + state_inputs(opt, graph, table)
    outs = interpreter.run(graph, inputs, param_values(table))
    write_back(opt, graph, table, outs)
