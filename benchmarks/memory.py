"""What checkpointing really saves: for each model and strategy, a cpu training step's
planned peak, the bytes its executable really holds, the process's peak RSS, step time,
compile time and matmul count. Issue 13's "Must show".

Run: `python benchmarks/memory.py` (`--quick` for smaller models, `--models mlp,cnn`,
`--strategies none,all`, `--json`). Models: an MLP of 16 Linear(512)-tanh layers (batch
256), the digits CNN of runtime/models.py (batch 64, 1x8x8 images) and a GPT block
stack (4 pre-norm blocks of 4-head causal attention and a 4x MLP, n_embd 128, T 128,
batch 16, over float inputs). Inputs are random: memory and time do not depend on the
values. Every row runs in a fresh process (with an empty compile cache), so its peak RSS
(VmHWM) is that step's alone: Python, numpy, ember, LLVM compiling the step, and the
step's buffers. Columns:
- ran: the strategy whose graph the step runs (`ember.recompute_strategy`): the compile pipeline
  keeps a strategy only where its fused graph plans less than its fallback's (all ->
  balanced -> none, runtime/pipeline.py);
- planned: the memory plan's peak (`memory_report()["peak_bytes"]`: params, optimizer
  state, inputs and the arena, kernel scratch included), real: what the executable holds
  (`real_bytes`), and their ratio;
- rss: peak RSS of the process, and how much of it came after the imports and the
  batch (compile and run);
- step: median ms per training step (SGD with momentum); compile: seconds to compile;
  each also as a ratio to the model's `none` row (xnone; rows are separate processes, so
  on a loaded machine the ratio is only as steady as the load);
- kernels: distinct kernel functions LLVM compiles (what compile time grows with);
- matmuls: `kernel.matmul` ops in the compiled graph (recomputation adds some);
- attn bwd: fused attention backward kernels (`kernel.attention_grad`, one per block when
  the recomputed graph lets `fuse` form them; otherwise 5 matmuls each and the scores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

STRATEGIES = ("none", "balanced", "min-cut", "all")
MIB = 1 << 20


def vm_hwm() -> int:
    """The process's peak resident set size in bytes (Linux: /proc/self/status VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- models --------------------------------------------------------------------------------

def build(name: str, quick: bool):
    """The model and one batch (x, y) for `name`."""
    from ember import nn
    from ember.runtime.models import Cnn

    F = nn.functional

    class Mlp(nn.Module):
        def __init__(self, depth: int, width: int):
            super().__init__()
            self.layers = [nn.Linear(width, width) for _ in range(depth)]
            self.head = nn.Linear(width, 10)

        def forward(self, x):
            for layer in self.layers:
                x = F.tanh(layer(x))
            return self.head(x)

    class Block(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.n1, self.attn = nn.LayerNorm(d), nn.MultiHeadAttention(d, heads, causal=True)
            self.n2, self.f1, self.f2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            x = x + self.attn(self.n1(x))
            return x + self.f2(F.gelu(self.f1(self.n2(x))))

    class Gpt(nn.Module):
        def __init__(self, layers: int, d: int, heads: int):
            super().__init__()
            self.blocks = [Block(d, heads) for _ in range(layers)]
            self.head = nn.Linear(d, 10)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x.mean(axis=1))

    if name == "mlp":
        depth, width, n = (8, 256, 128) if quick else (16, 512, 256)
        model, shape = Mlp(depth, width), (n, width)
    elif name == "cnn":
        model, shape = Cnn(), (64, 1, 8, 8)
    elif name == "gpt":
        layers, d, t, n = (2, 64, 64, 8) if quick else (4, 128, 128, 16)
        model, shape = Gpt(layers, d, 4), (n, t, d)
    else:
        raise SystemExit(f"unknown model {name!r}: one of mlp, cnn, gpt")
    rng = np.random.default_rng(0)
    return model, (rng.standard_normal(shape).astype(np.float32),
                   rng.integers(0, 10, shape[0]))


def describe(name: str, quick: bool) -> str:
    return {"mlp": "MLP 8x256 b128" if quick else "MLP 16x512 b256",
            "cnn": "digits CNN b64",
            "gpt": "GPT 2x64 T64 b8" if quick else "GPT 4x128 T128 b16"}[name]


# -- one row, in its own process -------------------------------------------------------------

def row(name: str, strategy: str, quick: bool, steps: int) -> dict:
    import ember as em
    from ember import optim
    from ember.backends.cpu import codegen

    em.seed(0)
    model, (x, y) = build(name, quick)
    base = vm_hwm()
    step = em.compile_train_step(model, em.nn.functional.cross_entropy,
                                 optim.SGD(lr=0.01, momentum=0.9), backend="cpu",
                                 recompute=strategy)
    step(x, y)  # compiles, then runs once
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t)
    report = step.memory_report()
    return {"model": name, "strategy": strategy,
            "ran": step.graph.attributes.get("ember.recompute_strategy", "none"),
            "kernels": codegen.kernel_count(codegen.plan(step.graph)),
            "planned": report["peak_bytes"],
            "real": report["real_bytes"], "rss": vm_hwm(), "rss_base": base,
            "step_ms": statistics.median(times) * 1e3, "compile_s": step.compile_seconds,
            "matmuls": sum(op.name in ("kernel.matmul", "ember.matmul")
                           for op in step.graph.walk()),
            "attn_bwd": sum(op.name == "kernel.attention_grad" for op in step.graph.walk())}


def run_row(name: str, strategy: str, quick: bool, steps: int) -> dict:
    """`row` in a fresh interpreter with an empty compile cache."""
    with tempfile.TemporaryDirectory() as cache:
        cmd = [sys.executable, __file__, "--row", name, strategy, "--steps", str(steps)]
        out = subprocess.run(cmd + (["--quick"] if quick else []), capture_output=True,
                             text=True, env={**os.environ, "EMBER_CACHE_DIR": cache})
    if out.returncode:
        raise RuntimeError(f"{name} / {strategy} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict], quick: bool) -> str:
    """One line per row; `xnone`: the step and compile time over the same model's `none` row
    (issue 13 bounds both at 1.5x)."""
    none = {r["model"]: r for r in rows if r["strategy"] == "none"}

    def over(r: dict, key: str) -> str:
        base = none.get(r["model"])
        return f"{r[key] / base[key]:>7.2f}" if base else f"{'-':>7}"

    head = (f"{'model':<20}{'strategy':<10}{'ran':<10}{'planned MiB':>12}{'real MiB':>10}"
            f"{'real/plan':>10}{'rss MiB':>9}{'(+run)':>8}{'step ms':>9}{'xnone':>7}"
            f"{'compile s':>10}{'xnone':>7}{'kernels':>8}{'matmuls':>8}{'attn bwd':>9}")
    lines = [head]
    for r in rows:
        lines.append(f"{describe(r['model'], quick):<20}{r['strategy']:<10}{r['ran']:<10}"
                     f"{r['planned'] / MIB:>12.1f}{r['real'] / MIB:>10.1f}"
                     f"{r['real'] / r['planned']:>10.2f}{r['rss'] / MIB:>9.0f}"
                     f"{(r['rss'] - r['rss_base']) / MIB:>8.0f}{r['step_ms']:>9.1f}"
                     f"{over(r, 'step_ms')}{r['compile_s']:>10.2f}{over(r, 'compile_s')}"
                     f"{r['kernels']:>8}{r['matmuls']:>8}{r['attn_bwd']:>9}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller MLP and GPT, fewer steps")
    ap.add_argument("--models", default="mlp,cnn,gpt")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--steps", type=int, default=None, help="timed steps per row")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    ap.add_argument("--row", nargs=2, metavar=("MODEL", "STRATEGY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    steps = args.steps or (3 if args.quick else 10)
    if args.row:
        print(json.dumps(row(*args.row, args.quick, steps)))
        return
    from ember.backends.cpu.machine import host

    print(f"# cpu backend on {host.host_cpu()}, {host.num_threads()} threads, "
          f"{steps} timed steps per row, each row in a fresh process")
    rows = []
    for name in args.models.split(","):
        for strategy in args.strategies.split(","):
            rows.append(run_row(name, strategy, args.quick, steps))
            print(f"# {name} {strategy}: done", file=sys.stderr, flush=True)
    print(table(rows, args.quick))
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
