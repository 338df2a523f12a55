"""`bucket-grads{bytes=N}`: a data-parallel gradient graph says when each bucket of its
gradients is final, so the step can reduce that bucket across ranks while the backward
still computes the next (PyTorch's DDP buckets its gradients the same way, 25 MiB each).

The gradients (the graph's last `len(ember.grads)` results) are taken in the order the
backward finishes them (their producers' places in the graph, the last pass's schedule),
into buckets of one dtype and at most `bytes` each (a larger gradient is a bucket of its
own); right after the producer of each bucket's last gradient, an
`ember.grads_ready(g, ...) {bucket = k}` names the bucket's gradients. The graph's
`ember.grad_buckets` lists, per bucket, the indexes of its gradients in `ember.grads`
(runtime/data_parallel.py lays its flat buffer out by bucket). Run it last: a later pass
could move a producer past its bucket's op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..ir import Builder, Graph, Value
from .manager import Pass, register_pass
from .narrow import tensor_type


def _buckets(grads: list[Value], finished: list[int], limit: int) -> list[list[int]]:
    """Gradient indexes grouped in finishing order: one dtype and at most `limit` bytes a
    bucket."""
    out: list[list[int]] = []
    size = 0
    for j in sorted(range(len(grads)), key=lambda j: finished[j]):
        t = tensor_type(grads[j])
        last = tensor_type(grads[out[-1][-1]]) if out else None
        if last is None or last.dtype != t.dtype or size + t.nbytes > limit:
            out.append([])
            size = 0
        out[-1].append(j)
        size += t.nbytes
    return out


@register_pass
@dataclass(frozen=True)
class BucketGrads(Pass):
    name: ClassVar[str] = "bucket-grads"
    bytes: int = 25 << 20

    def apply(self, graph: Graph) -> Graph:
        n = len(graph.attributes.get("ember.grads", ()))
        if not n:
            return graph
        grads = list(graph.return_op.operands[-n:])
        block = graph.body
        place = {op: k for k, op in enumerate(block.ops)}
        finished = [place[g.op] if g.op is not None else -1 for g in grads]  # -1: an argument
        buckets = _buckets(grads, finished, self.bytes)
        # inserted from the last bucket back, so the places of earlier ones stay true
        for k in reversed(range(len(buckets))):
            after = max(finished[j] for j in buckets[k])
            b = Builder(block, before=block.ops[after + 1])
            b.create("ember.grads_ready", [grads[j] for j in buckets[k]], {"bucket": k})
        graph.attributes["ember.grad_buckets"] = buckets
        return graph


__all__ = ["BucketGrads"]
