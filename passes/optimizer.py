"""`optimizer{kind=sgd|adam|adamw ...}`: the parameter update as IR, after autodiff.

It turns a graph returning (loss, outputs..., grads...) into a whole training step:
the update of every param with a gradient is computed in the graph, so forward,
backward and update compile into one native call. Follows PyTorch's formulas.

Contract (read by the runtime):
- new arguments after the original ones: `lr` and `step` (scalars; `step` counts from 1),
  then one per optimizer state tensor, named in `ember.state` as "<param id>:<slot>";
- results: (loss, outputs..., new params in `ember.updates` order, new state tensors in
  `ember.state` order); `ember.grads` is replaced by `ember.updates`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..ir import Builder, Graph, TensorType, Value, numpy_dtype
from .manager import Pass, PipelineError, register_pass

SLOTS = {"sgd": ("momentum",), "adam": ("exp_avg", "exp_avg_sq"),
         "adamw": ("exp_avg", "exp_avg_sq")}


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

    def check(self, graph: Graph) -> None:
        if "ember.grads" not in graph.attributes:
            raise PipelineError("optimizer needs the gradients from autodiff: run autodiff first")
        if self.kind not in SLOTS:
            raise PipelineError(f"optimizer kind {self.kind!r} is not one of {', '.join(SLOTS)}")

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
        params = {op.attributes["id"]: op.result for op in graph.params()}
        dtype = grads[0].type.dtype if grads else "f32"
        scalar = TensorType((), dtype)
        lr = graph.body.add_arg(scalar, "lr")
        step = graph.body.add_arg(scalar, "step")
        b = Builder(graph.body, before=ret)
        if self.clip_norm > 0 and grads:
            grads = self._clip(b, grads)
        new_params, new_state, state_names = [], [], []
        for pid, g in zip(ids, grads):
            state = {s: graph.body.add_arg(g.type, None) for s in self.slots()}
            p_new, s_new = self._update(b, params[pid], g, lr, step, state)
            new_params.append(p_new)
            for s in self.slots():
                new_state.append(s_new[s])
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
                      axes=list(range(g.type.rank)), keepdims=False)
            total = sq if total is None else b.op("ember.add", total, sq)
        norm = b.op("ember.add", b.op("ember.sqrt", total), const(1e-6))
        coef = b.op("ember.min", b.op("ember.div", const(self.clip_norm), norm), const(1.0))
        return [b.op("ember.mul", g, coef) for g in grads]
