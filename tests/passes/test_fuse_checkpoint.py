"""`fuse` on checkpointed graphs keeps what checkpointing saved: recomputed copies never
share a kernel with forward ops, and backward kernels do not keep their inputs alive
longer than the unfused ops did, so the fused planned peaks stay ordered
none >= balanced >= all and no larger than the unfused ones."""

from __future__ import annotations

from model_graphs import mixed

from ember.ir import verify
from ember.passes import PassManager, parse_pipeline
from ember.passes.memory import plan_memory

STRATEGIES = ("none", "balanced", "min-cut", "all")


def run_pipeline(graph, pipeline: str):
    return verify(PassManager(parse_pipeline(pipeline), verify_each=True).run(graph))


def test_fused_peaks_keep_the_checkpoint_order_on_the_mixed_model():
    unfused, fused = {}, {}
    for s in STRATEGIES:
        base = f"decompose,autodiff,checkpoint{{strategy={s}}},optimizer,canonicalize,cse,dce"
        unfused[s] = plan_memory(run_pipeline(mixed().graph, base)).peak_bytes
        g = run_pipeline(mixed().graph, base + ",fuse")
        assert any(op.name in ("kernel.fused", "kernel.matmul") for op in g.ops), s
        fused[s] = plan_memory(g).peak_bytes
    assert fused["none"] >= fused["balanced"] >= fused["all"], fused
    assert fused["none"] > fused["all"], fused
    for s in STRATEGIES[1:]:
        assert fused[s] <= unfused[s], (s, fused[s], unfused[s])

