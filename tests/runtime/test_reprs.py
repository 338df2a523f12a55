"""What a REPL and a notebook show: one-line reprs of graphs and compiled functions, HTML
with the IR folded, and tqdm.auto's progress bar (a widget in Jupyter)."""

from __future__ import annotations

import html

import numpy as np

import ember as em
from ember import nn, optim
from ember.runtime.models import Mlp


def test_graph_repr_is_one_line_and_html_folds_the_text():
    graph = em.trace(Mlp(), em.TensorSpec((4, 64)))
    assert repr(graph) == f"<Graph @forward(tensor<4x64xf32>) -> (tensor<4x10xf32>): " \
                          f"{len(graph.ops)} ops>"
    page = graph._repr_html_()
    assert page.startswith("<details><summary>") and html.escape(str(graph)) in page
    assert "<Graph" not in page  # escaped


def test_compiled_reprs_name_model_settings_and_shapes():
    em.seed(0)
    step = em.compile_train_step(Mlp(), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 recompute="all")
    assert repr(step) == ("TrainStep(Mlp, SGD(lr=0.1, momentum=0.0, nesterov=False, "
                          "weight_decay=0.0), recompute='all', backend='cpu', "
                          "not compiled yet)")
    assert "<details>" not in step._repr_html_()
    step(np.zeros((4, 64), np.float32), np.zeros(4, np.int64))
    assert repr(step).endswith("backend='cpu', compiled for [4, 64], [4])")
    assert "@train_step" in step._repr_html_()
    forward = em.compile(Mlp(), np.zeros((2, 64), np.float32), backend="interpreter")
    assert repr(forward) == "CompiledFunction(Mlp, backend='interpreter', compiled for [2, 64])"
    grad = em.compile_grad(Mlp(), nn.functional.cross_entropy)
    assert repr(grad) == "GradFunction(Mlp, backend='cpu', not compiled yet)"


def test_progress_bars_come_from_tqdm_autonotebook():
    """tqdm.autonotebook (a widget in notebooks), not tqdm.auto: its asyncio wrapper calls
    iter() on the loader when built, and each iter() of a DataLoader serves the next epoch
    (a resumed run then skipped one; test_checkpoint's Ctrl-C test caught it)."""
    import tqdm.autonotebook

    from ember.runtime import train

    assert train.tqdm is tqdm.autonotebook.tqdm
