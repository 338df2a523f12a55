"""The I/O of a lowered optimizer update, and `opt.step` for hand-written loops.

`opt.step(model, grads)` builds a small graph of ember.param ops and gradient inputs,
lowers it with the same `optimizer` pass a compiled step uses, and runs it, so a hand
loop and a compiled step apply bit-for-bit the same formulas.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from ..backends import interpreter
from ..ir import Builder, Graph, TensorType, numpy_dtype
from ..passes.manager import parse_pipeline
from .backend import to_host
from .params import param_table, param_values


def hyper_inputs(opt, dtype: str | None = None) -> list:
    """The `lr` (one per param group) and `step` arguments of a lowered update: numpy
    scalars of `dtype`, or without one Python floats, which every backend casts to the
    graph's dtype as it binds them (the cpu backend straight into its scalar buffers: no
    numpy scalar per step)."""
    values = opt.group_lrs()
    values.append(opt.step_count + 1.0)
    return values if dtype is None else list(map(numpy_dtype(dtype).type, values))


def mark_param_groups(graph: Graph, opt) -> Graph:
    """`graph` with `ember.param_groups`, the ids of each group's params, where `opt` has
    several groups (what the `optimizer` pass reads to give each param its group's
    settings); set on the traced graph, whose ids the stage cache numbers."""
    ids = opt.group_ids()
    if ids is not None:
        graph.attributes["ember.param_groups"] = [list(group) for group in ids]
    return graph


class SettingsWatch:
    """Says cheaply whether `owner.optimizer`'s settings (what `update_key()`, hence a
    compiled update, is made of) may have changed since the watch was made: the same
    optimizer with the same attributes, but for the two a step changes (`state`,
    `step_count`), and no param group added or edited since (`GroupEdits`: a group's
    settings are written into the group, in place). It runs on every step (one call,
    `unchanged`), so the attributes are read in one C-level call and compared, identity
    first, as one tuple."""

    def __init__(self, owner):
        self.owner = owner
        self.opt = opt = owner.optimizer
        self.count = len(vars(opt))
        self.read = attrgetter(*(k for k in vars(opt) if k not in ("state", "step_count")))
        self.values = self.read(opt)
        self.edits = opt.group_edits()

    def unchanged(self) -> bool:
        opt = self.owner.optimizer
        try:
            return opt is self.opt and len(opt.__dict__) == self.count \
                and opt.group_edits() == self.edits \
                and self.read(opt) == self.values
        except AttributeError:  # a setting deleted (and another added)
            return False


@dataclass(frozen=True)
class UpdateLayout:
    """Where a lowered update's new params and optimizer state sit: the graph's last
    results, in the order of its `ember.updates` and `ember.state` (`<param id>:<slot>`)."""

    updates: tuple[str, ...]
    state: tuple[tuple[str, str], ...]  # (param id, slot name)

    @classmethod
    def of(cls, graph: Graph) -> UpdateLayout:
        a = graph.attributes
        return cls(tuple(a["ember.updates"]),
                   tuple(tuple(name.rsplit(":", 1)) for name in a["ember.state"]))


def state_inputs(opt, layout: UpdateLayout, table: dict) -> list[np.ndarray]:
    return [opt.slot(table[pid].id, slot, table[pid]) for pid, slot in layout.state]


def write_back(opt, layout: UpdateLayout, table: dict, outs: list, set_param=None,
               count: bool = True) -> None:
    """Store the new params and optimizer state a lowered update returned; count the step
    (unless not `count`: a step skipped by loss scaling, which returned the old values).

    Params are rebound to the returned arrays by `set_param(table, pid, value)` (a compiled
    step's: device arrays stay on the device), else brought to the host; optimizer state
    stays where the backend put it.
    """
    new = outs[len(outs) - len(layout.updates) - len(layout.state):]
    for pid, value in zip(layout.updates, new):
        if set_param is not None:
            set_param(table, pid, value)
        else:
            table[pid].set_value(to_host(value))
    state = opt.state
    for (pid, slot), value in zip(layout.state, new[len(layout.updates):]):
        state[table[pid].id][slot] = value
    if count:
        opt.step_count += 1


def update_graph(opt, table: dict, ids: list[str], scale: float = 1.0,
                 clipping: bool = True, loss_scale: bool = False) -> Graph:
    """The optimizer's update of params `ids` alone: gradients in (multiplied by `scale`:
    a data-parallel step's 1/world_size), new params and state out; without `clipping`
    whatever the optimizer's clip_norm (a sharded step clips before: runtime/zero.py).
    With `loss_scale` the gradients are scaled losses' (16-mixed): the graph takes the
    scale after them, divides by it and keeps the old values where any gradient is not
    finite, its first result saying whether all were (passes/optimizer.py)."""
    graph = Graph("update", [TensorType(table[pid].shape, table[pid].dtype) for pid in ids])
    if loss_scale:
        graph.body.add_arg(TensorType((), "f32"), "loss_scale")
        graph.attributes["ember.loss_scale"] = len(ids)
    b = Builder(graph.body)
    for pid in ids:
        b.create("ember.param", [], {"id": pid, "path": pid},
                 result_types=[TensorType(table[pid].shape, table[pid].dtype)])
    grads = list(graph.args[:len(ids)])
    if scale != 1.0:
        grads = [b.op("ember.mul", g, b.op("ember.constant", value=np.array(
            scale, dtype=numpy_dtype(g.type.dtype)))) for g in grads]
    b.create("func.return", grads)
    graph.attributes["ember.grads"] = ids
    (lower,) = parse_pipeline(opt.pass_spec(clipping))
    return lower.apply(mark_param_groups(graph, opt))


def apply_update(opt, model, grads) -> None:
    table = param_table(model)
    only = opt.param_ids  # PyTorch's spelling named these params (in its groups)
    ids = [pid for pid, p in table.items()
           if p.id in grads and p.requires_grad and (only is None or p.id in only)]
    if not ids:
        return
    dtype = table[ids[0]].dtype
    graph = update_graph(opt, table, ids)
    inputs = [grads[table[pid].id] for pid in ids]
    layout = UpdateLayout.of(graph)
    inputs += hyper_inputs(opt, dtype) + state_inputs(opt, layout, table)
    outs = interpreter.run(graph, inputs, param_values(table))
    write_back(opt, layout, table, outs)
