"""Compiled functions: inference, gradients and whole training steps.

Each keeps a cache keyed by the input shapes and the model's params state (flags,
requires_grad): a change recompiles, with a one-line notice, and never runs a stale graph.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..frontend.module import Module
from ..frontend.trace import TensorSpec, trace_function
from ..ir import Graph
from .backend import get_backend
from .params import GradientsParams, param_table, param_values, state_key
from .pipeline import Stages, grad_pipeline, inference_pipeline, training_pipeline
from .update import hyper_inputs, state_inputs, write_back


@dataclass
class Entry:
    """One compiled graph and what produced it."""

    graph: Graph
    run: Callable
    stages: Stages
    compile_seconds: float
    specs: tuple = field(default_factory=tuple)


class Compiled:
    """Shared machinery: specs → trace → pipeline → backend, cached by key."""

    kind = "forward"

    def __init__(self, model: Module, backend: str, linear: str = "split"):
        self.model, self.backend_name, self.linear = model, backend, linear
        self.backend = get_backend(backend)
        self._cache: dict[tuple, Entry] = {}
        self._last: Entry | None = None

    # subclasses: the function to trace and the pipeline to run
    def traced_fn(self) -> Callable:
        raise NotImplementedError

    def pipeline(self) -> list[str]:
        raise NotImplementedError

    def entry(self, inputs: tuple) -> Entry:
        specs = tuple(TensorSpec.of(x) for x in inputs)
        table = param_table(self.model)
        key = (tuple((s.shape, s.dtype) for s in specs), state_key(table))
        entry = self._cache.get(key)
        if entry is None:
            if self._last is not None:
                was = ", ".join(str(list(s.shape)) for s in self._last.specs)
                now = ", ".join(str(list(s.shape)) for s in specs)
                print(f"ember: recompiling {self.kind} (inputs {now}; was {was}, or model "
                      "flags/requires_grad changed)", file=sys.stderr)
            entry = self._compile(specs)
            self._cache[key] = entry
        self._last = entry
        return entry

    def _compile(self, specs: tuple) -> Entry:
        start = time.perf_counter()
        graph = trace_function(self.traced_fn(), self.model, specs, name=self.kind)
        stages = Stages(graph, self.pipeline())
        run = self.backend.compile(stages.graph)
        entry = Entry(stages.graph, run, stages, time.perf_counter() - start, specs)
        dump = os.environ.get("EMBER_DUMP_IR")
        if dump:
            write_stages(stages, dump, prefix=self.kind)
        return entry

    def execute(self, inputs: tuple, extra: tuple = ()) -> tuple[Entry, list[np.ndarray]]:
        entry = self.entry(inputs)
        values = param_values(param_table(self.model))
        return entry, entry.run([*inputs, *extra], values)

    @property
    def stages(self) -> list[str]:
        return self._require().stages.names

    def ir(self, stage: str | None = None) -> str:
        """The IR text after `stage` (default: the final, compiled one)."""
        texts = self._require().stages.texts
        if stage is None:
            return str(self._require().graph)
        if stage not in texts:
            raise KeyError(f"no stage {stage!r}; stages are {', '.join(texts)}")
        return texts[stage]

    @property
    def compile_seconds(self) -> float:
        return self._require().compile_seconds

    def _require(self) -> Entry:
        if self._last is None:
            raise RuntimeError(f"this {self.kind} has not been compiled yet: call it once")
        return self._last


def write_stages(stages: Stages, directory: str, prefix: str = "") -> list[str]:
    """One `.mlir` file per stage, numbered in pipeline order."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, (name, text) in enumerate(stages.texts.items()):
        path = os.path.join(directory, f"{prefix}{'.' if prefix else ''}{i:02d}-{name}.mlir")
        with open(path, "w") as f:
            f.write(text)
        paths.append(path)
    return paths


class CompiledFunction(Compiled):
    """`em.compile(model, *specs)`: the model's forward, numpy in, numpy out."""

    def __init__(self, model: Module, specs: tuple, backend: str = "cpu", linear: str = "split"):
        super().__init__(model, backend, linear)
        self.entry(specs)

    def traced_fn(self):
        return self.model

    def pipeline(self):
        return inference_pipeline(self.linear)

    def __call__(self, *inputs: np.ndarray):
        _, outs = self.execute(inputs)
        return outs[0] if len(outs) == 1 else tuple(outs)


class GradFunction(Compiled):
    """`em.compile_grad(model, loss_fn)`: call(x, y) returns GradientsParams."""

    kind = "grad"

    def __init__(self, model: Module, loss_fn: Callable, backend: str = "cpu",
                 linear: str = "split"):
        super().__init__(model, backend, linear)
        self.loss_fn = loss_fn
        self.loss: float | None = None

    def traced_fn(self):
        return lambda x, *targets: self.loss_fn(self.model(x), *targets)

    def pipeline(self):
        return grad_pipeline(self.linear)

    def __call__(self, *inputs: np.ndarray) -> GradientsParams:
        entry, outs = self.execute(inputs)
        table = param_table(self.model)
        ids = entry.graph.attributes["ember.grads"]
        self.loss = float(outs[0])
        grads = outs[len(outs) - len(ids):]
        return GradientsParams({table[pid].id: g for pid, g in zip(ids, grads)})


class TrainStep(Compiled):
    """`em.compile_train_step(...)`: forward, backward and update as one compiled graph."""

    kind = "train_step"

    def __init__(self, model: Module, loss_fn: Callable, optimizer, backend: str = "cpu",
                 linear: str = "split"):
        super().__init__(model, backend, linear)
        self.loss_fn, self.optimizer = loss_fn, optimizer

    def traced_fn(self):
        return lambda x, *targets: self.loss_fn(self.model(x), *targets)

    def pipeline(self):
        return training_pipeline(self.optimizer.pass_spec(), self.linear)

    def __call__(self, *inputs: np.ndarray) -> float:
        entry = self.entry(inputs)
        table = param_table(self.model)
        dtype = entry.graph.args[len(inputs)].type.dtype
        extra = hyper_inputs(self.optimizer, dtype) + state_inputs(self.optimizer, entry.graph,
                                                                   table)
        outs = entry.run([*inputs, *extra], param_values(table))
        write_back(self.optimizer, entry.graph, table, outs)
        return float(outs[0])
