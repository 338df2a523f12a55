"""`autodiff`: append the backward pass to a graph whose first result is the loss.

Contract: the input returns (loss, outputs...), the loss a scalar float tensor. The output
returns (loss, outputs..., grad_1, ..., grad_k), one gradient per trainable param id (kind
absent or "float", `requires_grad` absent or true), in order of first appearance, and the
graph attribute `ember.grads` lists those ids in the same order. Backward ops are emitted
only for values on a path from a trainable param to the loss; an op with the attribute
`stop_gradient = true` cuts that path. An `nn.*` op on bf16/f16 values is differentiated on
its f32 twin (passes/widen.py), as `decompose` lowers it: its gradients computed in f32,
each rounded once (a multi-op rule such as attention's would otherwise round every
intermediate, and its ops would not fuse into `kernel.attention_grad`); CSE then merges
the twin with the decomposed forward.

`autodiff{loss_scale=true}` (dynamic loss scaling, `16-mixed`): the backward starts from a
new scalar argument of the loss's type rather than from 1, so every gradient comes out
multiplied by it, and small ones survive f16; `ember.loss_scale` holds its index among the
graph's arguments (the `optimizer` pass divides the gradients by it again).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import ClassVar

from ...ir import Builder, Graph, Operation, TensorType, Value
from ..decompose import const
from ..manager import Pass, PipelineError, register_pass
from ..narrow import tensor_type
from ..widen import is_low, needs_widening, twin
from .rules import RULES


class AutodiffError(PipelineError):
    """The graph cannot be differentiated (no scalar loss, nothing trainable, no rule)."""


def trainable(op: Operation) -> bool:
    a = op.attributes
    return (op.name == "ember.param" and a.get("kind", "float") == "float"
            and a.get("requires_grad", True) is not False and op.result.type.is_float)


def is_float(v: Value) -> bool:
    return isinstance(v.type, TensorType) and v.type.is_float


def active_values(ops: list[Operation], params: list[Operation], loss: Value) -> set[Value]:
    """Values that depend on a trainable param and that the loss depends on; the result of
    an op marked `stop_gradient = true` is a constant to autodiff."""
    forward = {p.result for p in params}
    for op in ops:
        stop = op.attributes.get("stop_gradient") is True
        if not stop and any(v in forward for v in op.operands):
            forward.update(r for r in op.results if is_float(r))
    backward = {loss}
    for op in reversed(ops):
        if any(r in backward for r in op.results):
            backward.update(op.operands)
    return forward & backward


def _where(op: Operation) -> str:
    return f"'{op.name}'" + (f" at {op.loc}" if op.loc else "")


def _order_hint(op: Operation) -> str:
    """Kernels exist only after `fuse`, which lowers to scalar bodies that have no rules:
    a kernel reaching autodiff means the pipeline is in the wrong order."""
    if op.dialect != "kernel":
        return ""
    return "; run autodiff before fuse (e.g. -p 'decompose,autodiff,fuse')"


@register_pass
@dataclass(frozen=True)
class Autodiff(Pass):
    name: ClassVar[str] = "autodiff"
    loss_scale: bool = False

    def check(self, graph: Graph) -> None:
        for key in ("ember.grads", "ember.updates"):
            if key in graph.attributes:
                raise PipelineError(f"autodiff: @{graph.name} already has '{key}': autodiff "
                                    "runs once, before the optimizer")

    def apply(self, graph: Graph) -> Graph:
        self.check(graph)
        ret = graph.return_op
        outputs = list(ret.operands)
        loss = outputs[0] if outputs else None
        if loss is None or not (is_float(loss) and tensor_type(loss).shape == ()):
            got = "no results" if loss is None else str(loss.type)
            raise AutodiffError(f"autodiff: the loss (first result of @{graph.name}) must be a "
                                f"scalar float tensor such as tensor<f32>, got {got}")
        params = [op for op in graph.params() if trainable(op)]
        if not params:
            raise AutodiffError(f"autodiff: @{graph.name} has no trainable ember.param "
                                "(all are frozen, flags or buffers): nothing to differentiate")
        forward = [op for op in graph.ops if op is not ret]
        active = active_values(forward, params, loss)
        b = Builder(graph.body, before=ret)
        grads: dict[Value, Value] = {loss: self._seed(graph, b, tensor_type(loss))}
        for op in reversed(forward):
            out_grads = [grads.get(r) for r in op.results]
            needs = [v in active for v in op.operands]
            if not any(needs) or all(g is None for g in out_grads):
                continue
            if op.name not in RULES:
                raise AutodiffError(f"autodiff: no gradient rule for op {_where(op)}"
                                    + _order_hint(op))
            b.loc = op.loc
            for v, g, need in zip(op.operands, _backward(b, op, out_grads, needs), needs):
                if need and g is not None:
                    if g.type != v.type:
                        raise AutodiffError(f"autodiff: the rule for {_where(op)} gave a "
                                            f"{g.type} gradient for a {v.type} operand")
                    grads[v] = b.op("ember.add", grads[v], g) if v in grads else g
        b.loc = None
        by_id: dict[str, list[Operation]] = {}
        for p in params:  # one gradient per id, even if a param op appears twice
            by_id.setdefault(p.attributes["id"], []).append(p)
        ret.drop_operands()
        for v in outputs + [_total(b, ps, grads) for ps in by_id.values()]:
            ret.add_operand(v)
        graph.attributes["ember.grads"] = list(by_id)
        return graph

    def _seed(self, graph: Graph, b: Builder, loss: TensorType) -> Value:
        """The loss's own gradient: 1, or the loss scale, a new argument."""
        if not self.loss_scale:
            return const(b, 1, loss.dtype)
        graph.attributes["ember.loss_scale"] = len(graph.args)
        return graph.body.add_arg(loss, "loss_scale")


def _backward(b: Builder, op: Operation, out_grads: list[Value | None],
              needs: list[bool]) -> list[Value | None]:
    """The gradients of `op`'s operands by its rule; an nn.* op's on bf16/f16 values
    computed on its f32 twin, each rounded to its operand's dtype once."""
    rule = RULES[op.name].backward
    if op.dialect != "nn" or not needs_widening(op):
        return rule(b, op, out_grads, needs)
    up = [b.op("ember.cast", g, dtype="f32") if g is not None and is_low(g) else g
          for g in out_grads]
    f32 = twin(b, op)
    grads = rule(b, f32, up, needs)
    if not any(r.uses for r in f32.results):
        f32.erase()  # the rule read only its operands
    return [b.op("ember.cast", g, dtype=v.type.dtype) if g is not None and is_low(v) else g
            for g, v in zip(grads, op.operands)]


def _total(b: Builder, ops: list[Operation], grads: dict[Value, Value]) -> Value:
    """The gradient of a param id; zeros when the loss does not depend on it."""
    gs = [grads[p.result] for p in ops if p.result in grads]
    if not gs:
        return _zeros(b, tensor_type(ops[0].result))
    return reduce(lambda x, y: b.op("ember.add", x, y), gs)


def _zeros(b: Builder, t: TensorType) -> Value:
    zero = const(b, 0, t.dtype)
    return zero if t.shape == () else b.op("ember.broadcast", zero, shape=list(t.shape))
