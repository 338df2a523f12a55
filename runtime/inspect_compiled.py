"""What a compiled function, gradient or training step shows of itself (`Inspectable`,
which runtime/compiled.py's `Compiled` is): its last compiled graph and the IR after each
stage, its compile time, seconds per kernel, and its repr (in a notebook, with the IR)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..frontend.module import Module
from ..ir import Graph
from ..ir.printer import print_graph, strip_locations
from .profile_trace import write_trace


class Inspectable:
    """The inspecting side of `Compiled` (compiled.py), on the graph it used last."""

    # what `Compiled` provides
    kind: str
    model: Module
    backend_name: str
    _last: Any  # the Entry of the last call, None before the first compile
    _cache: Mapping[tuple, Any]  # every Entry kept
    param_table: Any
    entry: Any
    arguments: Any
    extra_inputs: Any
    params: Any

    @property
    def stages(self) -> list[str]:
        return self._require().stages.names

    def ir(self, stage: str | None = None, debuginfo: bool = False) -> str:
        """The IR text after `stage` (default: the final, compiled one); `debuginfo` keeps
        each op's `loc(...)`, the source line that made it."""
        if stage is None:
            return print_graph(self._require().graph, debuginfo=debuginfo)
        text = self._require().stages.text(stage)  # a KeyError names the stages
        return text if debuginfo else strip_locations(text)

    def profile(self, *inputs: np.ndarray, path: str | None = None,
                repeat: int = 20) -> list[tuple[str, float]]:
        """Seconds per kernel of the compiled graph on `inputs` (median of `repeat` runs;
        params, optimizer state and counters are left as they were). With `path`, also a
        Chrome/Perfetto trace JSON with one event per kernel (runtime/profile_trace.py)."""
        table = self.param_table()
        entry = self.entry(inputs, table)
        native = getattr(entry.run, "profile", None)
        if native is None:
            raise NotImplementedError(f"the {self.backend_name} backend does not time its "
                                      "kernels; profile on the cpu backend")
        args = self.arguments(entry, inputs) + self.extra_inputs(entry, table)
        kernels = native(args, self.params(table), repeat=repeat)
        if path is not None:
            write_trace(path, kernels, process=f"{self.kind} ({self.backend_name} backend)")
        return kernels

    def dump_ir(self, directory: str) -> list[str]:
        """Write every stage of the last compiled graph to `directory` (numbered)."""
        return self._require().stages.write(directory, prefix=self.kind)

    @property
    def graph(self) -> Graph:
        return self._require().graph

    def settings(self) -> list[str]:
        """What `repr` shows besides the model and backend (a step's optimizer)."""
        return []

    def __repr__(self) -> str:
        """`TrainStep(Mlp, SGD(lr=0.1, ...), backend='cpu', compiled for [32, 64], [32])`."""
        parts = [type(self.model).__name__, *self.settings(), f"backend={self.backend_name!r}"]
        if self._last is None:
            parts.append("not compiled yet")
        else:
            shapes = ", ".join(str(list(s.shape)) for s in self._last.specs)
            more = len(self._cache) - 1
            parts.append(f"compiled for {shapes}" + (f" (+{more} cached)" if more else ""))
        return f"{type(self).__name__}({', '.join(parts)})"

    def _repr_html_(self) -> str:
        """A notebook shows the repr and, folded, the compiled IR."""
        from html import escape

        head = f"<p><code>{escape(repr(self))}</code></p>"
        return head if self._last is None else head + self._last.graph._repr_html_()

    @property
    def compile_seconds(self) -> float:
        return self._require().compile_seconds

    def _require(self) -> Any:
        """The Entry of the last call; a RuntimeError before the first compile."""
        if self._last is None:
            raise RuntimeError(f"this {self.kind} has not been compiled yet: call it once")
        return self._last


__all__ = ["Inspectable"]
