"""The compile pipelines, stage by stage: what runs between tracing and a backend.

A dump (`step.ir(stage)`, `--dump-ir`) names each stage as listed here.
"""

from __future__ import annotations

from ..ir import Graph
from ..passes.manager import PassManager, parse_pipeline

SIMPLIFY = ["canonicalize", "cse", "dce"]


def inference_pipeline(linear: str = "split") -> list[str]:
    return [f"decompose{{linear={linear}}}", *SIMPLIFY]


def grad_pipeline(linear: str = "split") -> list[str]:
    return [f"decompose{{linear={linear}}}", "autodiff", *SIMPLIFY]


def training_pipeline(optimizer_spec: str, linear: str = "split") -> list[str]:
    return [f"decompose{{linear={linear}}}", "autodiff", optimizer_spec, *SIMPLIFY]


class Stages:
    """Runs a pipeline on a traced graph and keeps the IR text of every stage."""

    def __init__(self, graph: Graph, pipeline: list[str], verify_each: bool = True):
        self.texts: dict[str, str] = {"traced": str(graph)}
        passes = parse_pipeline(",".join(pipeline))
        manager = PassManager(passes, verify_each=verify_each, on_stage=self._keep)
        self.graph = manager.run(graph)
        self.timings = manager.timings

    def _keep(self, name: str, graph: Graph) -> None:
        key, n = name, 2
        while key in self.texts:
            key, n = f"{name}.{n}", n + 1
        self.texts[key] = str(graph)

    @property
    def names(self) -> list[str]:
        return list(self.texts)
