"""Upstream `mlir-opt` accepts what ember prints, and ember parses back what mlir-opt prints
(custom form, generic form, with debug locations) to an equal graph.

Graphs are batched into one mlir-opt run per print mode with `--split-input-file`.
"""

from __future__ import annotations

import random
import subprocess

import pytest
from strategies import assert_graphs_equal, mlir_opt, op_graph, random_graph

from ember.ir import OPS
from ember.ir.parser import parse
from ember.ir.printer import print_graph

MLIR_OPT = mlir_opt()
pytestmark = pytest.mark.skipif(MLIR_OPT is None, reason="mlir-opt not found (on PATH as "
                                "mlir-opt or mlir-opt-19, or /usr/lib/llvm-19/bin/mlir-opt); "
                                "install Debian's mlir-19-tools")
SPLIT = "// -----\n"
MODES = {"custom": [], "generic": ["--mlir-print-op-generic"],
         "debuginfo": ["--mlir-print-debuginfo"],
         "generic-debuginfo": ["--mlir-print-op-generic", "--mlir-print-debuginfo"]}


def graphs():
    return [op_graph(n) for n in sorted(OPS)] + [random_graph(random.Random(s))
                                                 for s in range(120)]


def run_mlir_opt(texts: list[str], flags: list[str]) -> list[str]:
    """mlir-opt over every text at once; its output split back into one text each."""
    proc = subprocess.run([MLIR_OPT, "--allow-unregistered-dialect", "--split-input-file",
                           *flags, "-"], input=SPLIT.join(texts), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    outs = proc.stdout.split(SPLIT)
    assert len(outs) == len(texts)
    return outs


@pytest.mark.parametrize("mode", MODES)
def test_mlir_opt_accepts_and_ember_parses_back(mode):
    gs = graphs()
    debug = "debuginfo" in mode
    texts = [print_graph(g, debuginfo=debug) for g in gs]
    for g, text, out in zip(gs, texts, run_mlir_opt(texts, MODES[mode])):
        try:
            back = parse(out)
            assert_graphs_equal(g, back, locs="given" if debug else False)
        except Exception as e:
            raise AssertionError(f"{e}\n--- ember printed:\n{text}\n--- mlir-opt printed:\n"
                                 f"{out}") from e
        # what ember prints of mlir-opt's output is again a fixpoint of print . parse
        assert print_graph(parse(print_graph(back))) == print_graph(back)


def test_mlir_opt_prints_big_constants_as_hex():
    import numpy as np

    from ember.ir import Builder, Graph

    g = Graph("f")
    a = np.linspace(-1, 1, 1000, dtype=np.float32)
    Builder(g.body).create("test.op", [], {"v": a, "s": np.full(500, 0.25, np.float32)}, [])
    (out,) = run_mlir_opt([print_graph(g)], [])
    assert 'dense<"0x' in out and "dense<2.500000e-01> : tensor<500xf32>" in out
    assert parse(out).ops[0].attributes["v"].tobytes() == a.tobytes()
