"""The compile pipelines, stage by stage: what runs between tracing and a backend.

A dump (`step.ir(stage)`, `--dump-ir`) names each stage as listed here.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import sys
import tempfile
import weakref

from ..ir import Graph, VerifyError, verify
from ..ir.memory_plan import plan_memory
from ..ir.parser import parse
from ..ir.printer import print_graph
from ..ir.types import LOW_PRECISION
from ..passes.manager import Pass, PassManager, parse_pipeline
from ..passes.recompute import Recompute
from ..settings import PASS_TIMING

SIMPLIFY = ["canonicalize", "cse", "dce"]
# legalization passes that rewrite what `fuse` made (kernel ops): they run right after it
AFTER_FUSE = frozenset({"low-precision-attention", "low-precision-storage"})


def inference_pipeline(linear: str = "split", layout: str | None = None) -> list[str]:
    """`layout`: a backend's pass choosing tensor layouts (its `LAYOUT`), on the
    decomposed graph, before the simplification that cancels its transposes."""
    return [f"decompose{{linear={linear}}}", *([layout] if layout else []), *SIMPLIFY,
            "fuse"]


def grad_pipeline(linear: str = "split", recompute: str = "none",
                  memory_budget: int | None = None) -> list[str]:
    """autodiff runs before decompose: the dedicated rules of nn.* ops (layer_norm,
    attention, softmax, cross_entropy, ...) keep fewer activations than differentiating
    their decomposition (a 2-layer GPT step saves 13.7 MB instead of 19.2, same values)."""
    return ["autodiff", f"decompose{{linear={linear}}}",
            *recompute_spec(recompute, memory_budget), *SIMPLIFY, "fuse"]


def recompute_spec(strategy: str = "none", memory_budget: int | None = None) -> list[str]:
    """The `recompute{...}` entry after autodiff (none for strategy "none")."""
    if strategy == "none" and not memory_budget:
        return []
    budget = f" budget={int(memory_budget)}" if memory_budget else ""
    return [f"recompute{{strategy={strategy}{budget}}}"]


def training_pipeline(optimizer_spec: str, linear: str = "split", recompute: str = "none",
                      memory_budget: int | None = None) -> list[str]:
    """Fusion runs under every recompute strategy: `fuse` never puts a recomputed copy
    (`ember.recompute`) or another backward op in one kernel with a forward op, groups
    recomputed copies as their originals were grouped (so they reuse the forward's kernel
    bodies), and in a recomputed graph merges backward ops into a kernel that reads a
    value past its last unfused reader only when every op in between joins that kernel
    and the late bytes are no more than the temporaries it no longer stores, so a fused
    recomputed step keeps the memory the strategy saved (its planned peak is no larger
    than the unfused one's; passes/fuse/grouping.py); where the
    finished graph still plans no less than its fallback's, `Stages` runs the fallback.
    autodiff runs first, as in `grad_pipeline`."""
    recomputing = recompute_spec(recompute, memory_budget)
    return ["autodiff", f"decompose{{linear={linear}}}", *recomputing, optimizer_spec,
            *SIMPLIFY, "fuse"]


def without_fusion(pipeline: list[str], option: str) -> list[str]:
    """`pipeline` with the `fuse` pass's boolean `option` off (a backend without a kernel
    for that fused form runs the unfused ops instead)."""
    passes = parse_pipeline(",".join(pipeline))
    return [str(dataclasses.replace(p, **{option: False})) if p.name == "fuse" else spec
            for spec, p in zip(pipeline, passes)]


def with_low_precision(pipeline: list[str], graph: Graph, legalize: str | None) -> list[str]:
    """`pipeline` with `legalize`, a backend's passes for bf16/f16 values (its
    `LEGALIZE_LOW_PRECISION`: `widen-low-precision` on cpu and cuda, whose kernels are f32,
    then `low-precision-gemm` on a cpu with a bf16 GEMM),
    before the simplification that cleans up its casts (those that rewrite kernel ops,
    `AFTER_FUSE`, right after `fuse`; none without it), where `graph` has such values or the
    pipeline makes some (`autocast`); an f32 graph's pipeline (and so its stages and cache
    keys) stays as it was."""
    values = [*graph.args, *(r for op in graph.walk() for r in op.results)]
    names = [p.name for p in parse_pipeline(",".join(pipeline))]
    if legalize is None or not ("autocast" in names
                                or any(v.type.dtype in LOW_PRECISION for v in values)):
        return pipeline
    at = next((i for i, n in enumerate(names) if n in (SIMPLIFY[0], "fuse")), len(names))
    passes = parse_pipeline(legalize)
    before = [str(p) for p in passes if p.name not in AFTER_FUSE]
    after = [str(p) for p in passes if p.name in AFTER_FUSE and "fuse" in names]
    fused = names.index("fuse") + 1 if after else len(names)
    return [*pipeline[:at], *before, *pipeline[at:fused], *after, *pipeline[fused:]]


def stage_names(pipeline: list[str]) -> list[str]:
    """The stage names a dump uses: "traced", then each pass, a repeated one as `name.2`."""
    names = ["traced"]
    for p in parse_pipeline(",".join(pipeline)):
        key, n = p.name, 2
        while key in names:
            key, n = f"{p.name}.{n}", n + 1
        names.append(key)
    return names


def candidates(passes: list[Pass]) -> list[list[Pass]]:
    """The pipeline, then, while its `recompute` has a fallback (`Recompute.fallback`),
    the pipeline with that instead: the strategy that recomputes most first."""
    out = [passes]
    at = next((k for k, p in enumerate(passes) if isinstance(p, Recompute)), None)
    while at is not None and (alt := out[-1][at].fallback()) is not None:
        out.append([*passes[:at], alt, *passes[at + 1:]])
    return out


class _TextFiles:
    """IR texts by stage name, kept on disk rather than in memory: each in a file of a
    temporary directory of its own, made at the first `put` and removed when the owner is
    collected (or at exit) by the process that made it (a forked child shares it and
    leaves it). Where the disk refuses a text (a full or read-only temp folder) it is kept
    in memory instead, as every text once was."""

    def __init__(self, owner: object):
        self._owner = weakref.ref(owner)
        self._dir: str | None = None
        self._paths: dict[str, str] = {}
        self._held: dict[str, str] = {}  # what the disk refused

    def put(self, name: str, text: str) -> None:
        self._held.pop(name, None)
        try:
            if self._dir is None:
                self._dir = tempfile.mkdtemp(prefix="ember-stages-")
                owner = self._owner()
                if owner is not None:
                    weakref.finalize(owner, _remove_texts, self._dir, os.getpid())
            path = self._paths.get(name) or os.path.join(self._dir, f"{len(self._paths):02d}.mlir")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            self._paths[name] = path
        except OSError:
            self._paths.pop(name, None)
            self._held[name] = text

    def get(self, name: str) -> str:
        if name in self._held:
            return self._held[name]
        path = self._paths[name]
        try:
            with open(path, encoding="utf-8", newline="") as f:
                return f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"the IR text of stage {name!r} was kept in {path}, which "
                                    "is gone (removed by a temp-folder cleaner?)") from None


def _remove_texts(directory: str, pid: int) -> None:
    if os.getpid() == pid:
        shutil.rmtree(directory, ignore_errors=True)


class Stages:
    """Runs a pipeline on a traced graph and keeps the final graph, which running needs,
    and the IR text of every stage, with each op's source location (`loc(...)`;
    `strip_locations` gives the plain text), on disk (`_TextFiles`: a temporary folder of
    its own, removed with it): neither the texts (2.2 MiB for a 6x256 MLP's training step,
    growing with the model) nor the traced and intermediate graphs stay in memory; `text`,
    `texts`, `write` and `unfused` read them back when asked.

    A recomputed pipeline runs its `candidates` and keeps the final graph that plans the
    least memory (ir/memory_plan.py), the one that recomputes less on a tie: recomputing
    that saves nothing once fused and updated is only slower (a 16-layer MLP under "all":
    its recomputed copies meet the grads and optimizer state at the end of the backward,
    1.3% over `none`). Its `ember.recompute_strategy` names the strategy that ran; the stage names
    stay those of `pipeline`. IR passes only, each a fraction of the backend's compile; the
    stage texts wait, as on a stage-cache hit, until someone asks for one.

    It also names the stage before `fuse`, whose text (`unfused_text`, with source
    locations) replays op by op to name the scalar op behind an error or a NaN, which a
    fused kernel would hide.

    Given the `final` graph (a stage cache hit, runtime/stage_cache.py), it runs no pass
    until someone asks for an intermediate stage's text or the unfused graph: then the
    passes run once on the traced graph's text, so every stage reads as if they had run at
    once and the unfused text has this trace's own source locations.
    """

    def __init__(self, graph: Graph, pipeline: list[str], verify_each: bool = True,
                 final: Graph | None = None):
        self.names = stage_names(pipeline)
        self._verify_each = verify_each
        self._candidates = candidates(parse_pipeline(",".join(pipeline)))
        self._files = _TextFiles(self)
        # dumps keep loc(...); printed before the passes change the graph, and what the
        # passes run on when they wait
        self._files.put("traced", print_graph(graph, debuginfo=True))
        # the stage the waiting passes start from (a hit, or the candidates ran), else None
        self._pending: str | None = "traced" if final is not None else None
        self._unfused: str | None = None  # the stage before `fuse`, once the passes ran
        self.cached = final is not None  # the final graph came from the stage cache
        self.digest: str | None = None  # set by the stage cache: names the final graph
        self.timings: list[tuple[str, float]] = []
        timing = PASS_TIMING.get()  # the backend prints its own
        self.graph = final if final is not None else (
            self._run(graph, timing) if len(self._candidates) == 1 else self._choose(graph, timing))

    @property
    def traced_text(self) -> str:
        """The traced graph's text, with source locations."""
        return self._files.get("traced")

    def _choose(self, graph: Graph, timing: bool) -> Graph:
        """The final graph of the candidate that plans the least memory (see the class),
        the passes run without keeping stage texts, each final graph verified (half the
        passes' time went to verifying every stage of every candidate; a failure runs that
        candidate again, verifying each stage, to name the pass)."""
        best: tuple[int, Graph] | None = None
        for k, passes in enumerate(reversed(self._candidates)):
            start = graph if k == len(self._candidates) - 1 else parse(self.traced_text)
            manager = PassManager(passes)
            final = manager.run(start)
            if self._verify_each:
                try:
                    verify(final)
                except VerifyError:
                    PassManager(passes, verify_each=True).run(parse(self.traced_text))
                    raise
            self.timings += manager.timings
            if timing:
                print(f"@{graph.name} IR passes ({', '.join(map(str, passes))}):\n"
                      f"{manager.timing_report()}", file=sys.stderr)
            peak = plan_memory(final, place=False).peak_bytes
            if best is None or peak < best[0]:
                best = (peak, final)
        self._pending = "traced"
        return best[1]

    def _chosen(self) -> list[Pass]:
        """The candidate the final graph came from: its recompute strategy."""
        if len(self._candidates) == 1:
            return self._candidates[0]
        strategy = self.graph.attributes.get("ember.recompute_strategy")
        return next(c for c in self._candidates
                    if any(isinstance(p, Recompute) and p.strategy == strategy for p in c))

    def _run(self, graph: Graph, timing: bool = False) -> Graph:
        """Run every pass on `graph`, writing each stage's text; the final graph."""
        passes = self._chosen()
        names = [p.name for p in passes]
        self._unfused = self.names[names.index("fuse")] if "fuse" in names else None
        after = iter(self.names[1:])

        def keep(name: str, stage: Graph) -> None:
            self._files.put(next(after), print_graph(stage, debuginfo=True))

        manager = PassManager(passes, verify_each=self._verify_each, on_stage=keep)
        final = manager.run(graph)
        self.timings = manager.timings
        if timing:
            print(f"@{graph.name} IR passes:\n{manager.timing_report()}", file=sys.stderr)
        return final

    def _ran(self) -> Stages:
        """Itself, after running the passes it deferred (a cache hit, or the candidates
        ran without texts), if any."""
        if self._pending is not None:
            graph = parse(self._files.get(self._pending))
            self._pending = None
            self._run(graph)
        return self

    def text(self, stage: str) -> str:
        """The IR text after `stage`; the traced and the final text need no deferred pass."""
        if stage not in self.names:
            raise KeyError(f"no stage {stage!r}; stages are {', '.join(self.names)}")
        if stage == "traced":
            return self.traced_text
        if self._pending is not None and stage == self.names[-1]:
            return print_graph(self.graph, debuginfo=True)
        return self._ran()._files.get(stage)

    @property
    def texts(self) -> dict[str, str]:
        """Stage name -> its IR text, in pipeline order (read back from disk: a new dict
        each time, which nothing here keeps)."""
        self._ran()
        return {name: self._files.get(name) for name in self.names}

    def write(self, directory: str, prefix: str) -> list[str]:
        """One `.mlir` file per stage, numbered in pipeline order, with each op's `loc(...)`.
        Earlier dumps of the same function in `directory` (before a recompile for new shapes,
        or by an earlier run) are kept: this one is then `<prefix>-2.00-traced.mlir`, `-3`, ...
        (the first file is created exclusively, so concurrent dumps never share a number)."""
        os.makedirs(directory, exist_ok=True)
        texts = list(self.texts.items())
        for n in itertools.count(1):
            base = os.path.join(directory, prefix if n == 1 else f"{prefix}-{n}")
            paths = [f"{base}.{i:02d}-{name}.mlir" for i, (name, _) in enumerate(texts)]
            try:
                with open(paths[0], "x") as f:
                    f.write(texts[0][1])
                break
            except FileExistsError:
                continue
        for path, (_, text) in zip(paths[1:], texts[1:]):
            with open(path, "w") as f:
                f.write(text)
        return paths

    @property
    def unfused_text(self) -> str | None:
        """The text of the stage before `fuse`, with source locations; None without one."""
        stage = self._ran()._unfused
        return None if stage is None else self._files.get(stage)

    def unfused(self) -> Graph:
        """The graph before fusion (the final one when nothing was fused)."""
        text = self.unfused_text
        return self.graph if text is None else parse(text)
