"""Recompute strategies on whole models: the same gradients, bit for bit, whatever is
recomputed; planned memory ordered none >= balanced >= all; the 16-block MLP's activation
memory; min-cut under a budget; and the pass's place in a pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from model_graphs import mixed, mlp

from ember.backends import interpreter
from ember.ir import verify
from ember.passes import PassManager, PipelineError, parse_pipeline
from ember.passes.memory import plan_memory
from ember.passes.recompute import STRATEGIES, Recompute

ORDER = ("none", "balanced", "min-cut", "all")


def run_pipeline(graph, pipeline: str):
    return verify(PassManager(parse_pipeline(pipeline), verify_each=True).run(graph))


def recomputed(graph) -> list[str]:
    return [op.name for op in graph.ops if op.attributes.get("ember.recompute")]


def table(rows: dict[str, dict], keys: tuple[str, ...]) -> str:
    head = f"{'strategy':<10}" + "".join(f"{k:>16}" for k in keys)
    return "\n".join([head] + [f"{s:<10}" + "".join(f"{r[k]:>16,}" for k in keys)
                               for s, r in rows.items()])


@pytest.mark.parametrize("order", ["decompose,autodiff", "autodiff,decompose"])
def test_mixed_model_same_gradients_and_ordered_peaks(order, capsys):
    """Conv2d, BatchNorm2d, GELU, max pool, LayerNorm, attention, Dropout, Linear: every
    strategy gives the same loss, running stats and gradients, bit for bit (recomputation
    repeats the same ops on the same values, dropout included)."""
    net = mixed()
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(4, 3, 8, 8)).astype(np.float32), np.array([0, 1, 4, 2]),
              np.array(3)]
    results, rows = {}, {}
    for s in ORDER:
        g = run_pipeline(mixed().graph, f"{order},recompute{{strategy={s}}}")
        assert g.attributes["ember.recompute_strategy"] == s
        results[s] = interpreter.run(g, inputs, net.values())
        rep = plan_memory(g).report()
        rows[s] = {**rep, "ops": len(g.ops), "recomputed": len(recomputed(g))}
    for s in ORDER[1:]:
        for got, want in zip(results[s], results["none"]):
            assert got.dtype == want.dtype and np.array_equal(got, want), s
    assert all(np.isfinite(r).all() for r in results["none"])
    peaks = [rows[s]["peak_bytes"] for s in ("none", "balanced", "all")]
    assert peaks[0] >= peaks[1] >= peaks[2] and peaks[0] > peaks[2]
    assert rows["all"]["saved"] == 0 and rows["none"]["recomputed"] == 0
    assert rows["none"]["saved"] > rows["balanced"]["saved"] >= rows["min-cut"]["saved"]
    with capsys.disabled():
        print(f"\nmixed model ({order}): planned memory per strategy (bytes)\n"
              + table(rows, ("peak_bytes", "saved", "temporaries", "arena_bytes", "ops",
                             "recomputed")))


def test_mixed_model_dropout_copies_keep_their_mask():
    g = run_pipeline(mixed().graph, "decompose,autodiff,recompute{strategy=all}")
    drops = [op for op in g.ops if op.name == "ember.dropout"]
    forward = drops[0]
    copies = [op for op in drops if op.attributes.get("ember.recompute")]
    assert copies, "strategy all recomputes the dropout"
    for c in copies:
        assert c.operands[1] is forward.operands[1]  # the same rng argument
        assert {k: v for k, v in c.attributes.items() if k != "ember.recompute"} == \
            forward.attributes


def test_mlp16_balanced_halves_activation_memory_without_recomputing_matmuls(capsys):
    """16 x (Linear 512 -> GELU), batch 256: IR only (nothing runs)."""
    rows = {}
    for s in ORDER:
        g = run_pipeline(mlp().graph, f"decompose,autodiff,recompute{{strategy={s}}}")
        names = recomputed(g)
        rep = plan_memory(g).report()
        rows[s] = {**rep, "recomputed": len(names), "matmuls": names.count("ember.matmul"),
                   "total_matmuls": sum(op.name == "ember.matmul" for op in g.ops)}
    none = rows["none"]
    for s in ("balanced", "min-cut"):
        assert rows[s]["saved"] <= 0.5 * none["saved"], s
        assert rows[s]["peak_bytes"] < none["peak_bytes"], s
    assert rows["balanced"]["matmuls"] == 0 and rows["min-cut"]["matmuls"] == 0
    assert rows["balanced"]["total_matmuls"] == none["total_matmuls"]
    assert rows["all"]["matmuls"] > 0
    with capsys.disabled():
        print("\n16-block MLP (512 wide, batch 256): planned memory per strategy (bytes)\n"
              + table(rows, ("peak_bytes", "saved", "temporaries", "recomputed", "matmuls")))


def test_min_cut_meets_a_budget_or_names_the_best_peak():
    peaks = {s: plan_memory(run_pipeline(mixed().graph, f"decompose,autodiff,recompute"
                                         f"{{strategy={s}}}")).peak_bytes
             for s in ("none", "all")}
    for budget in (peaks["none"], (peaks["none"] + peaks["all"]) // 2, peaks["all"] + 64):
        g = run_pipeline(mixed().graph,
                         f"decompose,autodiff,recompute{{strategy=min-cut budget={budget}}}")
        assert plan_memory(g).peak_bytes <= budget
    with pytest.raises(PipelineError, match=r"the memory budget of 1000 bytes cannot be met: "
                                            r"the best achievable planned peak is \d+ bytes"):
        run_pipeline(mixed().graph, "decompose,autodiff,recompute{strategy=min-cut budget=1000}")


def test_a_budget_the_strategy_exceeds_is_an_error():
    with pytest.raises(PipelineError, match="strategy none needs a planned peak of"):
        run_pipeline(mixed().graph, "decompose,autodiff,recompute{budget=1000}")


def test_looser_budgets_recompute_less():
    net = mixed()
    costs = []
    for s in ("none", "all"):
        costs.append(plan_memory(run_pipeline(net.graph if s == "none" else mixed().graph,
                                              f"decompose,autodiff,recompute{{strategy={s}}}")
                                 ).peak_bytes)
    loose, tight = (run_pipeline(mixed().graph, f"decompose,autodiff,recompute{{strategy=min-cut "
                                                f"budget={b}}}") for b in (costs[0], costs[1] + 64))
    assert len(recomputed(loose)) <= len(recomputed(tight))


@pytest.mark.parametrize("pipeline, reason", [
    ("recompute", "run autodiff first"),
    ("decompose,recompute", "run autodiff first"),
    ("decompose,autodiff,optimizer,recompute", "must run before optimizer"),
    ("decompose,autodiff,recompute,recompute", "through recompute already"),
])
def test_pipeline_order_is_checked(pipeline, reason):
    with pytest.raises(PipelineError, match=reason):
        run_pipeline(mlp(2, 8, 4).graph, pipeline)


def test_options():
    assert Recompute.STRATEGIES == STRATEGIES == ("none", "all", "balanced", "min-cut")
    assert str(parse_pipeline("recompute{strategy=min-cut budget=4096}")[0]) == \
        "recompute{strategy=min-cut budget=4096}"
    with pytest.raises(PipelineError, match="strategy='half'"):
        parse_pipeline("recompute{strategy=half}")
    with pytest.raises(PipelineError, match="budget"):
        parse_pipeline("recompute{budget=-1}")


def test_linear_keep_runs_end_to_end():
    """decompose{linear=keep}: nn.linear stays in the forward (kept by recompute as a
    compute-bound op); its dedicated backward gives split's gradients."""
    net = mixed()
    rng = np.random.default_rng(1)
    inputs = [rng.normal(size=(4, 3, 8, 8)).astype(np.float32), np.array([3, 1, 0, 2]),
              np.array(0)]
    out = {}
    for linear in ("keep", "split"):
        g = run_pipeline(mixed().graph, f"decompose{{linear={linear}}},autodiff,"
                                        "recompute{strategy=balanced},canonicalize,cse,dce")
        assert g.attributes["ember.linear"] == linear
        kept = [op for op in g.ops if op.name == "nn.linear"]
        assert bool(kept) == (linear == "keep")
        assert not any(op.attributes.get("ember.recompute") for op in kept)
        out[linear] = interpreter.run(g, inputs, net.values())
    for a, b in zip(out["keep"], out["split"]):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_training_step_after_recompute():
    """recompute, then the optimizer and the usual cleanup: the update matches none's."""
    net = mlp(3, 8, 4, activation="tanh")
    rng = np.random.default_rng(2)
    inputs = [rng.normal(size=(4, 8)).astype(np.float32), np.array([1, 0, 3, 9])]
    extra = [np.float32(0.1), np.float32(1.0)]
    out = {}
    for s in ORDER:
        g = run_pipeline(mlp(3, 8, 4, activation="tanh").graph,
                         f"decompose,autodiff,recompute{{strategy={s}}},optimizer,"
                         "canonicalize,cse,dce")
        assert recomputed(g) or s == "none"  # cse keeps the copies
        out[s] = interpreter.run(g, inputs + extra, net.values())
    for s in ORDER[1:]:
        for a, b in zip(out[s], out["none"]):
            assert np.array_equal(a, b), s


def test_frontend_model_trains_identically_under_every_strategy(capsys):
    """The same mix built from the frontend's layers and trained three steps through
    em.compile_train_step on the interpreter (fused under every strategy): losses,
    params, BatchNorm running stats and dropout masks agree across strategies."""
    import ember as em
    from ember import nn, optim

    F = nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.pool = nn.MaxPool2d(2)
            self.norm = nn.LayerNorm(8)
            self.attn = nn.MultiHeadAttention(8, 2, causal=True)
            self.drop = nn.Dropout(0.2)
            self.head = nn.Linear(8, 5)

        def forward(self, x):
            h = self.pool(F.gelu(self.bn(self.conv(x))))
            t = self.norm(h.reshape((h.shape[0], h.shape[1], -1)).transpose((0, 2, 1)))
            t = t + self.drop(self.attn(t))
            return self.head(t.mean(axis=1))

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 3, 8, 8)).astype(np.float32), np.array([0, 1, 2, 3])
    runs, rows = {}, {}
    for s in ORDER:
        em.seed(0)
        model = Net()
        step = em.compile_train_step(model, F.cross_entropy, optim.SGD(lr=0.1),
                                     backend="interpreter", recompute=s)
        losses = [step(x, y) for _ in range(3)]
        runs[s] = losses, {k: np.array(v) for k, v in model.state_dict().items()}
        rows[s] = step.memory_report()
    # every step is fused (runtime/pipeline.py); fusion reassociates the reductions
    # differently per schedule, so the strategies agree to rounding
    for s in ORDER[1:]:
        np.testing.assert_allclose(runs[s][0], runs["none"][0], rtol=1e-5)
        for k, v in runs["none"][1].items():
            np.testing.assert_allclose(runs[s][1][k], v, rtol=1e-5, atol=1e-6, err_msg=s)
    peaks = [rows[s]["peak_bytes"] for s in ("none", "balanced", "all")]
    assert peaks[0] >= peaks[1] >= peaks[2]
    with capsys.disabled():
        print("\nfrontend model, training step: planned memory per strategy (bytes)\n"
              + table(rows, ("peak_bytes", "params", "optimizer_state", "saved",
                             "temporaries")))
