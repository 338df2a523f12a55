"""Passes, the pass registry, pipeline text (`decompose{linear=split},autodiff`) and the
pass manager that runs a pipeline with verification, IR dumps and timing, as mlir-opt does.

A pass is a frozen dataclass with a `name`; its fields are its options, so a pipeline
string fully describes what runs and a dump can name each stage.
"""

from __future__ import annotations

import dataclasses
import difflib
import gc
import shlex
import sys
import textwrap
import time
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, TextIO

from ..ir import Graph, VerifyError, verify


class PipelineError(ValueError):
    """A pipeline string is malformed, or a pass cannot run on the graph it is given."""


@dataclass(frozen=True)
class Pass:
    """Base of every pass: subclass as a frozen dataclass; fields are the options."""

    name: ClassVar[str] = ""

    def check(self, graph: Graph) -> None:
        """Raise PipelineError when the graph is not what this pass expects (wrong order)."""

    def apply(self, graph: Graph) -> Graph:
        raise NotImplementedError

    @classmethod
    def options(cls) -> dict[str, type]:
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    @classmethod
    def from_options(cls, opts: dict[str, str]) -> Pass:
        known = cls.options()
        kwargs = {}
        for key, text in opts.items():
            if key not in known:
                listed = ", ".join(known) or "none"
                raise PipelineError(f"pass '{cls.name}' has no option '{key}' "
                                    f"(its options: {listed})")
            kwargs[key] = _convert(cls.name, key, text, known[key])
        return cls(**kwargs)

    def __str__(self) -> str:
        opts = " ".join(f"{f.name}={_format(getattr(self, f.name))}"
                        for f in dataclasses.fields(self)
                        if getattr(self, f.name) != f.default)
        return f"{self.name}{{{opts}}}" if opts else self.name


PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no pass name")
    if PASSES.get(cls.name, cls) is not cls:
        raise ValueError(f"pass {cls.name} registered twice")
    PASSES[cls.name] = cls
    return cls


def _convert(pass_name: str, key: str, text: str, kind: type) -> Any:
    try:
        if kind is bool:
            if text not in ("true", "false"):
                raise ValueError
            return text == "true"
        return kind(text)
    except ValueError:
        want = "true or false" if kind is bool else getattr(kind, "__name__", str(kind))
        raise PipelineError(f"pass '{pass_name}': bad value {text!r} for option '{key}' "
                            f"(expected {want})") from None


def _format(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _split_top(text: str) -> list[str]:
    """Split on commas outside braces."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            raise PipelineError(f"unbalanced '}}' in pipeline {text!r}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise PipelineError(f"unbalanced '{{' in pipeline {text!r}")
    return parts + [cur]


def unknown_pass(name: str, where: str = "") -> PipelineError:
    """The error for a pass name that is not registered: the closest names first (a typo's
    fix is usually one of them), then every pass."""
    close = difflib.get_close_matches(name, PASSES, n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return PipelineError(f"{where}unknown pass '{name}'{hint} (known passes: "
                         f"{', '.join(sorted(PASSES))})")


def describe_passes() -> str:
    """Every registered pass with its options and its docstring's first line, for
    `ember opt --list-passes` and `--help`."""
    lines = []
    for name in sorted(PASSES):
        cls = PASSES[name]
        opts = " ".join(f"{k}=<{getattr(t, '__name__', t)}>" for k, t in cls.options().items())
        lines.append(f"  {name}{f'{{{opts}}}' if opts else ''}")
        lines += textwrap.wrap(_summary(cls), 92, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
    return "\n".join(lines)


def _summary(cls: type[Pass]) -> str:
    """The first paragraph of the pass's own docstring, else of its module's (one pass per
    file); dataclass's generated `Name(field, ...)` docstring is no summary."""
    for doc in (cls.__doc__, sys.modules[cls.__module__].__doc__):
        first = " ".join((doc or "").strip().split("\n\n", 1)[0].split())
        if first and not first.startswith(f"{cls.__name__}("):
            return first
    return ""


def parse_pipeline(text: str) -> list[Pass]:
    """`"decompose{linear=split},autodiff,canonicalize"` -> pass instances, in order."""
    passes = []
    for part in _split_top(text.strip()):
        part = part.strip()
        if not part:
            if text.strip():
                raise PipelineError(f"empty pass name in pipeline {text!r}")
            continue
        name, _, rest = part.partition("{")
        name = name.strip()
        if name not in PASSES:
            raise unknown_pass(name)
        if rest and not rest.rstrip().endswith("}"):
            raise PipelineError(f"pass '{name}': options must end with '}}', got {part!r}")
        opts = {}
        for item in shlex.split(rest.rstrip()[:-1]) if rest else []:
            key, eq, value = item.partition("=")
            if not eq:
                raise PipelineError(f"pass '{name}': option {item!r} is not key=value")
            opts[key] = value
        passes.append(PASSES[name].from_options(opts))
    return passes


class PassManager:
    """Runs passes in order; optionally verifies, dumps the IR and times each one."""

    def __init__(self, passes: Iterable[Pass], verify_each: bool = False,
                 print_ir_after_all: bool = False, print_ir_after: Iterable[str] = (),
                 timing: bool = False, on_stage: Callable[[str, Graph], None] | None = None,
                 out: TextIO | None = None):
        self.passes = list(passes)
        self.verify_each = verify_each
        self.print_ir_after_all = print_ir_after_all
        self.print_ir_after = set(print_ir_after)
        unknown = sorted(self.print_ir_after - PASSES.keys())
        if unknown:  # a typo would otherwise print nothing, silently
            raise unknown_pass(unknown[0], "--print-ir-after: ")
        self.timing = timing  # timings are always kept; the caller prints timing_report()
        self.on_stage = on_stage
        self.out = out
        self.timings: list[tuple[str, float]] = []

    def run(self, graph: Graph) -> Graph:
        """The passes in order, with Python's cycle collector paused: a graph is one big
        cycle (values <-> uses), so every collection the passes' allocations trigger walks
        all of it, a quadratic cost (a 32-layer GPT's fuse: 6.4 s with it, 2.6 s without);
        the garbage is collected once they are done."""
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._run(graph)
        finally:
            if paused:
                gc.enable()

    def _run(self, graph: Graph) -> Graph:
        for p in self.passes:
            start = time.perf_counter()
            p.check(graph)
            graph = p.apply(graph)
            self.timings.append((p.name, time.perf_counter() - start))
            if self.verify_each:
                try:
                    verify(graph)
                except VerifyError as e:
                    raise VerifyError(f"after pass '{p.name}': {e.message}", e.line,
                                      e.col) from None
            if self.print_ir_after_all or p.name in self.print_ir_after:
                out = self.out or sys.stderr
                out.write(f"// -----// IR Dump After {p.name} //----- //\n{graph}\n")
            if self.on_stage is not None:
                self.on_stage(p.name, graph)
        return graph

    def timing_report(self) -> str:
        total = sum(t for _, t in self.timings) or 1e-12
        rule = "===" + "-" * 73 + "==="
        lines = [rule, "... Pass execution timing report ...".center(len(rule)).rstrip(), rule,
                 f"  Total Execution Time: {total:.4f} seconds", "",
                 "  ----Wall Time----  ----Name----"]
        lines += [f"  {t:9.4f} ({100 * t / total:5.1f}%)  {name}" for name, t in self.timings]
        lines.append(f"  {total:9.4f} (100.0%)  Total")
        return "\n".join(lines)
