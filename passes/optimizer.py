"""`optimizer{kind=sgd|adam|adamw ...}`: the parameter update as IR, after autodiff.

It turns a graph returning (loss, outputs..., grads...) into a whole training step:
the update of every param with a gradient is computed in the graph, so forward,
backward and update compile into one native call. Follows PyTorch's formulas.

Param groups (PyTorch's): `groups=` gives each group's settings, `;` between groups, each
a `,`-separated list of `name=value` that differ from the pass's own options (the first
group's, so its entry is empty): `optimizer{kind=adamw weight_decay=0.1
groups=;weight_decay=0.0}`. The graph's `ember.param_groups` (a list per group of the
param ids it holds, which the runtime sets on the traced graph) says which group each
gradient's param is in; a param with a gradient in no group is an error. Without
`groups`, one group takes every gradient. The optimizer's kind and its clipping (by the
norm of all gradients together) are the same for every group.

With dynamic loss scaling (`ember.loss_scale`, left by `autodiff{loss_scale=true}`), the
gradients are divided by that argument first; a step with any inf or NaN among them changes
nothing (each new param and state tensor is a select of the old one), as
torch.amp.GradScaler skips `optimizer.step()`, and result 1 (`ember.grads_finite` holds its
index) says whether they were all finite, for the runtime to count the step and adjust the
scale.

A bf16 or f16 param is updated in f32 (`computed`): its value, gradient and state (kept
in its dtype) cast up, the new ones rounded once; `lr` and `step` are then f32.

Contract (read by the runtime):
- new arguments after the original ones: one `lr` per param group (`lr`, then `lr1`,
  `lr2`, ...: fed, so that changing one does not recompile) and `step` (scalars; `step`
  counts from 1), then one per optimizer state tensor, named in `ember.state` as
  "<param id>:<slot>";
- results: (loss, outputs..., new params in `ember.updates` order, new state tensors in
  `ember.state` order); `ember.grads` is replaced by `ember.updates`, and
  `ember.param_groups` is dropped.

`accumulate-grads{divide=k}` (gradient accumulation, runtime/accumulate.py) runs between
autodiff (and recompute) and `optimizer`, or instead of it: each gradient `g` becomes
`(acc + g) / k`, `acc` a new argument of the gradient's type after the original ones, one
per gradient in `ember.grads` order, which the graph names in `ember.grad_inputs` (kept
by `optimizer`). With `divide=1` the results are the new accumulated gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from ..ir import Builder, Graph, TensorType, Value, numpy_dtype
from ..ir.types import LOW_PRECISION
from .manager import Pass, PipelineError, register_pass
from .narrow import rank

SLOTS = {"sgd": ("momentum",), "adam": ("exp_avg", "exp_avg_sq"),
         "adamw": ("exp_avg", "exp_avg_sq")}


def computed(dtype: str) -> str:
    """The dtype an update of `dtype` params computes in: f32 for bf16 and f16 (whose
    rounding would lose it: bf16's 0.999 is 1.0, so Adam's bias correction would be 0)."""
    return "f32" if dtype in LOW_PRECISION else dtype


def cast(b: Builder, v: Value, dtype: str) -> Value:
    return v if v.type.dtype == dtype else b.op("ember.cast", v, dtype=dtype)


@register_pass
@dataclass(frozen=True)
class Optimizer(Pass):
    name: ClassVar[str] = "optimizer"
    kind: str = "sgd"
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    clip_norm: float = 0.0  # > 0: scale all grads so their global L2 norm is at most this
    groups: str = ""  # each param group's own settings (module docstring); "": one group

    def check(self, graph: Graph) -> None:
        if "ember.grads" not in graph.attributes:
            raise PipelineError("optimizer needs the gradients from autodiff: run autodiff first")
        if self.kind not in SLOTS:
            raise PipelineError(f"optimizer kind {self.kind!r} is not one of {', '.join(SLOTS)}")

    def rules(self) -> list[Optimizer]:
        """The update of each param group: this pass with the group's own settings."""
        if not self.groups:
            return [self]
        return [self._group(k, entry) for k, entry in enumerate(self.groups.split(";"))]

    def _group(self, k: int, entry: str) -> Optimizer:
        """Group `k`'s update: its entry's settings over this pass's, parsed as options."""
        pairs = [item.partition("=") for item in entry.split(",") if item]
        shared = [name for name, eq, _ in pairs if name in ("kind", "clip_norm", "groups")]
        if shared or not all(eq for _, eq, _ in pairs):
            raise PipelineError(f"optimizer: group {k} of groups={self.groups!r} must be "
                                "name=value settings other than kind, clip_norm and groups")
        texts = {name: value for name, _, value in pairs}
        parsed = Optimizer.from_options(texts)  # checks each name and value
        return replace(self, groups="", **{name: getattr(parsed, name) for name in texts})

    def group_of(self, graph: Graph, ids: list[str], count: int) -> list[int]:
        """The group of each gradient's param, from `ember.param_groups` (which it pops)."""
        listed = graph.attributes.pop("ember.param_groups", None)
        if count == 1:
            return [0] * len(ids)
        if not isinstance(listed, list) or len(listed) != count:
            raise PipelineError(f"optimizer: groups= gives {count} param groups, so the graph "
                                "needs ember.param_groups, a list of each one's param ids")
        index: dict[str, int] = {}
        for k, members in enumerate(listed):
            for pid in members:
                if index.setdefault(pid, k) != k:
                    raise PipelineError(f"optimizer: param {pid} is in param groups "
                                        f"{index[pid]} and {k}")
        paths = {op.attributes["id"]: op.attributes.get("path") for op in graph.params()}
        if left := [paths.get(pid) or pid for pid in ids if pid not in index]:
            raise PipelineError(f"optimizer: {', '.join(left)} get gradients but are in no "
                                "param group")
        return [index[pid] for pid in ids]

    def slots(self) -> tuple[str, ...]:
        if self.kind == "sgd" and self.momentum == 0.0:
            return ()
        return SLOTS[self.kind]

    def apply(self, graph: Graph) -> Graph:
        self.check(graph)
        ids = list(graph.attributes.pop("ember.grads"))
        ret = graph.return_op
        outputs = list(ret.operands)
        kept, grads = outputs[:len(outputs) - len(ids)], outputs[len(outputs) - len(ids):]
        rules = self.rules()
        group = self.group_of(graph, ids, len(rules))
        params = {op.attributes["id"]: op.result for op in graph.params()}
        dtype = computed(grads[0].type.dtype) if grads else "f32"
        scalar = TensorType((), dtype)
        lrs = [graph.body.add_arg(scalar, f"lr{k or ''}") for k in range(len(rules))]
        step = graph.body.add_arg(scalar, "step")
        b = Builder(graph.body, before=ret)
        finite = None
        if "ember.loss_scale" in graph.attributes and grads:
            grads, finite = _unscaled(b, grads, graph.args[graph.attributes["ember.loss_scale"]])
            at = min(1, len(kept))  # after the loss; first in an update graph (runtime/update.py)
            kept.insert(at, finite)
            graph.attributes["ember.grads_finite"] = at
        if self.clip_norm > 0 and grads:
            grads = self._clip(b, grads)
        new_params, new_state, state_names = [], [], []
        for pid, g, k in zip(ids, grads, group):
            rule = rules[k]
            own = params[pid].type  # g's before unscaling
            state = {s: graph.body.add_arg(own, None) for s in rule.slots()}
            f = computed(own.dtype)
            p, old = cast(b, params[pid], f), {s: cast(b, v, f) for s, v in state.items()}
            p_new, s_new = rule._update(b, p, cast(b, g, f), lrs[k], step, old)
            if finite is not None:  # a skipped step keeps every old value
                p_new = b.op("ember.select", finite, p_new, p)
                s_new = {s: b.op("ember.select", finite, v, old[s]) for s, v in s_new.items()}
            new_params.append(cast(b, p_new, own.dtype))
            for s in rule.slots():
                new_state.append(cast(b, s_new[s], own.dtype))
                state_names.append(f"{pid}:{s}")
        ret.drop_operands()
        for v in kept + new_params + new_state:
            ret.add_operand(v)
        graph.attributes["ember.updates"] = ids
        graph.attributes["ember.state"] = state_names
        return graph

    def _update(self, b: Builder, p: Value, g: Value, lr: Value, step: Value,
                state: dict[str, Value]) -> tuple[Value, dict[str, Value]]:
        def const(x: float) -> Value:
            return b.op("ember.constant", value=np.array(x, dtype=numpy_dtype(p.type.dtype)))

        def axpy(a: float, x: Value, y: Value) -> Value:  # a*x + y
            return b.op("ember.add", b.op("ember.mul", const(a), x), y)

        if self.kind == "adamw" and self.weight_decay:
            decay = b.op("ember.sub", const(1.0), b.op("ember.mul", lr, const(self.weight_decay)))
            p = b.op("ember.mul", p, decay)
        elif self.weight_decay:
            g = axpy(self.weight_decay, p, g)
        if self.kind == "sgd":
            if not self.momentum:
                return b.op("ember.sub", p, b.op("ember.mul", lr, g)), {}
            buf = axpy(self.momentum, state["momentum"], g)
            direction = axpy(self.momentum, buf, g) if self.nesterov else buf
            return b.op("ember.sub", p, b.op("ember.mul", lr, direction)), {"momentum": buf}
        m = axpy(self.beta1, state["exp_avg"], b.op("ember.mul", const(1 - self.beta1), g))
        v = axpy(self.beta2, state["exp_avg_sq"],
                 b.op("ember.mul", const(1 - self.beta2), b.op("ember.mul", g, g)))
        bc1 = b.op("ember.sub", const(1.0), b.op("ember.pow", const(self.beta1), step))
        bc2 = b.op("ember.sub", const(1.0), b.op("ember.pow", const(self.beta2), step))
        denom = b.op("ember.add", b.op("ember.div", b.op("ember.sqrt", v), b.op("ember.sqrt", bc2)),
                     const(self.eps))
        step_size = b.op("ember.div", lr, bc1)
        p_new = b.op("ember.sub", p, b.op("ember.mul", step_size, b.op("ember.div", m, denom)))
        return p_new, {"exp_avg": m, "exp_avg_sq": v}

    def _clip(self, b: Builder, grads: list[Value]) -> list[Value]:
        """PyTorch's clip_grad_norm_: g * min(1, clip_norm / (||all grads||_2 + 1e-6))."""
        dtype = numpy_dtype(grads[0].type.dtype)

        def const(x: float) -> Value:
            return b.op("ember.constant", value=np.array(x, dtype=dtype))

        total = None
        for g in grads:
            sq = b.op("ember.reduce_sum", b.op("ember.mul", g, g),
                      axes=list(range(rank(g))), keepdims=False)
            total = sq if total is None else b.op("ember.add", total, sq)
        assert total is not None  # grads is not empty: grads[0] is read above
        norm = b.op("ember.add", b.op("ember.sqrt", total), const(1e-6))
        coef = b.op("ember.min", b.op("ember.div", const(self.clip_norm), norm), const(1.0))
        return [b.op("ember.mul", g, coef) for g in grads]


def _unscaled(b: Builder, grads: list[Value], scale: Value) -> tuple[list[Value], Value]:
    """The gradients divided by the loss `scale` (in the dtype their update computes in),
    and whether all of them are finite (i1): sum(g * 0) is 0 unless some g is inf or NaN."""
    inv = b.op("ember.div", b.op("ember.constant", value=np.array(
        1, numpy_dtype(scale.type.dtype))), scale)
    out, total = [], None
    for g in grads:
        f = computed(g.type.dtype)
        g = b.op("ember.mul", cast(b, g, f), cast(b, inv, f))
        zero = b.op("ember.constant", value=np.array(0, numpy_dtype(f)))
        poison = cast(b, b.op("ember.reduce_sum", b.op("ember.mul", g, zero),
                              axes=list(range(rank(g))), keepdims=False), scale.type.dtype)
        total = poison if total is None else b.op("ember.add", total, poison)
        out.append(g)
    assert total is not None  # grads is not empty
    zero = b.op("ember.constant", value=np.array(0, numpy_dtype(scale.type.dtype)))
    return out, b.op("ember.cmp", total, zero, predicate="eq")


@register_pass
@dataclass(frozen=True)
class AccumulateGrads(Pass):
    """Gradient accumulation: each gradient g becomes (acc + g) / divide, acc a new
    argument (`ember.grad_inputs`); see the module docstring."""

    name: ClassVar[str] = "accumulate-grads"
    divide: int = 1

    def check(self, graph: Graph) -> None:
        if "ember.grads" not in graph.attributes:
            raise PipelineError("accumulate-grads needs the gradients from autodiff: run "
                                "autodiff first")
        if "ember.grad_inputs" in graph.attributes:
            raise PipelineError("accumulate-grads ran twice")
        if self.divide < 1:
            raise PipelineError(f"accumulate-grads: divide must be >= 1, got {self.divide}")

    def apply(self, graph: Graph) -> Graph:
        self.check(graph)
        ids = list(graph.attributes["ember.grads"])
        ret = graph.return_op
        outputs = list(ret.operands)
        first = len(outputs) - len(ids)
        b = Builder(graph.body, before=ret)
        new = []
        for g in outputs[first:]:
            total = b.op("ember.add", graph.body.add_arg(g.type, None), g)
            if self.divide != 1:
                total = b.op("ember.div", total, b.op("ember.constant", value=np.array(
                    self.divide, dtype=numpy_dtype(g.type.dtype))))
            new.append(total)
        ret.drop_operands()
        for v in outputs[:first] + new:
            ret.add_operand(v)
        graph.attributes["ember.grad_inputs"] = ids
        return graph
