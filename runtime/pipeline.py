"""The compile pipelines, stage by stage: what runs between tracing and a backend.

A dump (`step.ir(stage)`, `--dump-ir`) names each stage as listed here.
"""

from __future__ import annotations

import os
import sys

from ..ir import Graph
from ..ir.parser import parse
from ..ir.printer import print_graph
from ..passes.manager import PassManager, parse_pipeline

SIMPLIFY = ["canonicalize", "cse", "dce"]


def inference_pipeline(linear: str = "split") -> list[str]:
    return [f"decompose{{linear={linear}}}", *SIMPLIFY, "fuse"]


def grad_pipeline(linear: str = "split", checkpoint: str = "none",
                  memory_budget: int | None = None) -> list[str]:
    return [f"decompose{{linear={linear}}}", "autodiff",
            *checkpoint_spec(checkpoint, memory_budget), *SIMPLIFY, "fuse"]


def checkpoint_spec(strategy: str = "none", memory_budget: int | None = None) -> list[str]:
    """The `checkpoint{...}` entry after autodiff (none for strategy "none")."""
    if strategy == "none" and not memory_budget:
        return []
    budget = f" budget={int(memory_budget)}" if memory_budget else ""
    return [f"checkpoint{{strategy={strategy}{budget}}}"]


def training_pipeline(optimizer_spec: str, linear: str = "split", checkpoint: str = "none",
                      memory_budget: int | None = None) -> list[str]:
    """Fusion runs under every checkpoint strategy: `fuse` never puts a recomputed copy
    (`ember.recompute`) or another backward op in one kernel with a forward op, and in a
    checkpointed graph never merges backward ops into a kernel that would read a value
    later than the unfused ops did, so a fused checkpointed step keeps the memory the
    strategy saved (its planned peak is no larger than the unfused one's)."""
    checkpointing = checkpoint_spec(checkpoint, memory_budget)
    return [f"decompose{{linear={linear}}}", "autodiff", *checkpointing, optimizer_spec,
            *SIMPLIFY, "fuse"]


class Stages:
    """Runs a pipeline on a traced graph and keeps the IR text of every stage.

    It also keeps the graph as it was before `fuse`, with source locations, as text
    (`unfused_text`): replaying that one op by op names the scalar op behind an error or
    a NaN, which a fused kernel would hide.
    """

    def __init__(self, graph: Graph, pipeline: list[str], verify_each: bool = True):
        self.texts: dict[str, str] = {"traced": str(graph)}
        passes = parse_pipeline(",".join(pipeline))
        names = [p.name for p in passes]
        self._before_fuse = names.index("fuse") - 1 if "fuse" in names else None
        self.unfused_text: str | None = None
        if self._before_fuse == -1:
            self.unfused_text = print_graph(graph, debuginfo=True)
        self._done = 0
        manager = PassManager(passes, verify_each=verify_each, on_stage=self._keep)
        self.graph = manager.run(graph)
        self.timings = manager.timings
        if os.environ.get("EMBER_PASS_TIMING"):  # the IR passes; the backend prints its own
            print(f"@{graph.name} IR passes:\n{manager.timing_report()}", file=sys.stderr)

    def _keep(self, name: str, graph: Graph) -> None:
        key, n = name, 2
        while key in self.texts:
            key, n = f"{name}.{n}", n + 1
        self.texts[key] = str(graph)
        if self._done == self._before_fuse:
            self.unfused_text = print_graph(graph, debuginfo=True)
        self._done += 1

    def unfused(self) -> Graph:
        """The graph before fusion (the final one when nothing was fused)."""
        return self.graph if self.unfused_text is None else parse(self.unfused_text)

    @property
    def names(self) -> list[str]:
        return list(self.texts)
