"""Gradient accumulation: `compile_train_step(..., accumulate=k)`.

Each call `step(x, y)` takes one micro-batch. The step compiles two graphs from one trace
(both keyed, like any graph, by the inputs' shapes):

- the *accumulate* graph, run by calls 1..k-1 of each cycle: forward and backward, then
  `acc + g` for every gradient (`accumulate-grads`, passes/optimizer.py), `acc` being the
  gradient buffers this class keeps (zeros at the first call of a cycle);
- the *update* graph, run by every k-th call: forward and backward of that micro-batch,
  `(acc + g) / k`, then the optimizer's update (`optimizer`), as one native call; the
  buffers are emptied.

So each micro-batch's gradient is weighted 1/k, as PyTorch's loop that calls
`(loss / k).backward()` k times before `opt.step()`: with a mean-reduced loss and k
micro-batches of one size, that is one step on their concatenation (up to the order of f32
sums). Micro-batches of different sizes (symbolic dims, or shapes that recompile) are
weighted 1/k each too, not by their sizes. The optimizer's `step_count`, hence its lr
schedule and Adam's bias correction, advance once per update; the rng counter (dropout)
once per micro-batch. A data-parallel step (runtime/data_parallel.py) runs the accumulate
graph on every call and reduces the buffers across ranks once per update.
"""

from __future__ import annotations

import numpy as np

from ..ir import numpy_dtype
from .inputs import count
from .pipeline import SIMPLIFY, recompute_spec


def accumulate_count(value) -> int:
    """`accumulate=` checked: an int (not a bool) >= 1."""
    return count("accumulate", value, "micro-batches per optimizer update")


def accumulation_pipeline(optimizer_spec: str | None, k: int, linear: str = "split",
                          recompute: str = "none",
                          memory_budget: int | None = None) -> list[str]:
    """The accumulate graph's pipeline (`optimizer_spec` None: returns `acc + g`) or the
    update graph's (the optimizer's update of `(acc + g) / k`); both as
    `training_pipeline`, autodiff first."""
    tail = ([f"accumulate-grads{{divide={k}}}", optimizer_spec] if optimizer_spec is not None
            else ["accumulate-grads"])
    return ["autodiff", f"decompose{{linear={linear}}}",
            *recompute_spec(recompute, memory_budget), *tail, *SIMPLIFY, "fuse"]


class Accumulator:
    """The gradient buffers of an accumulating step, by ParamId, and how many micro-batches
    they hold (`pending`, 0..k-1)."""

    def __init__(self, k: int):
        self.k = k
        self.pending = 0
        self.grads: dict = {}  # ParamId -> the sum of the pending micro-batches' gradients

    @property
    def updates_next(self) -> bool:
        """Whether the next micro-batch completes the cycle (runs the update)."""
        return self.pending == self.k - 1

    def inputs(self, entry, table: dict) -> list:
        """The graph's `ember.grad_inputs` arguments: each param's buffer, zeros where it
        has none yet. Refused (before anything runs) when a buffer would be dropped: a param
        stopped requiring grad with micro-batches pending."""
        ids = entry.graph.attributes["ember.grad_inputs"]
        grads, out, found = self.grads, [], 0
        for pid in ids:
            p = table[pid]
            g = grads.get(p.id)
            if g is None:
                g = np.zeros(p.shape, numpy_dtype(p.dtype))
            else:
                found += 1
            out.append(g)
        if found != len(grads):
            taken = {table[pid].id for pid in ids}
            left = [str(pid) for pid in grads if pid not in taken]
            raise ValueError(
                f"{self.pending} micro-batch(es) are accumulated for params that this step's "
                f"graph no longer updates ({', '.join(left[:3])}): requires_grad changed "
                "mid-accumulation; change it right after an update (step.pending == 0)")
        return out

    def keep(self, entry, table: dict, tail: list) -> None:
        """The accumulate graph's results: the new buffers; one more micro-batch pending."""
        ids = entry.graph.attributes["ember.grad_inputs"]
        self.grads = {table[pid].id: g for pid, g in zip(ids, tail)}
        self.pending += 1

    def reset(self) -> None:
        self.grads, self.pending = {}, 0

    def restore(self, pending: int, grads: dict) -> None:
        """What a checkpoint saved mid-accumulation holds (0 and {}: none pending)."""
        if pending and not 0 < pending < self.k:
            raise ValueError(f"{pending} accumulated micro-batches do not fit accumulate="
                             f"{self.k}")
        self.grads, self.pending = dict(grads), pending


__all__ = ["Accumulator", "accumulate_count", "accumulation_pipeline"]
