"""What checkpointing really saves: for each model and strategy, a cpu training step's
planned peak, the bytes its executable really holds, the process's peak RSS, step time,
compile time and matmul count. Issue 13's "Must show".

Run: `python benchmarks/memory.py` (`--quick` for smaller models, `--models mlp,cnn`,
`--strategies none,all`, `--json`). Models: an MLP of 16 Linear(512)-tanh layers (batch
256), the digits CNN of runtime/models.py (batch 64, 1x8x8 images) and a GPT block
stack (4 pre-norm blocks of 4-head causal attention and a 4x MLP, n_embd 128, T 128,
batch 16, over float inputs), each trained with SGD with momentum 0.9. Not in the default
`--models` (slow: minutes on a few cores): `gpt2`, issue 36's GPT-2-small body,
benchmarks/gpt.py's char-level `Gpt` with 12 blocks of n_embd 768 and 12 heads, T 256,
batch 4 and a 65-token vocab (85.4M params), trained with AdamW (lr 1e-3, torch's
defaults) for 3 steps (the first call compiles and runs step 1; `--steps` defaults to 2
for it). Inputs are random: memory and time do not depend on the values. Every row runs
in a fresh process (with an empty compile cache), so its peak RSS (VmHWM) is that step's
alone: Python, numpy, ember, LLVM compiling the step, and the step's buffers.

A model with a PyTorch twin (`gpt2`: benchmarks/gpt.py's `torch_twin`, same weights) also
gets a `torch` row, PyTorch eager in its own process with the same AdamW and batch, 3
steps (one untimed, then `--steps`), when torch is importable (`--torch` insists on it,
`--no-torch` skips it). That process builds the ember model only to copy its weights; it
frees it and resets VmHWM (`/proc/self/clear_refs`) before the twin trains, so the torch
row's rss is the peak from there on (still counting everything then resident: Python,
numpy, torch, ember's modules, the twin, the batch). Columns:
- opt: the optimizer (SGD-m: SGD with momentum; AdamW: two state tensors per param);
- ran: the strategy whose graph the step runs (`ember.recompute_strategy`): the compile pipeline
  keeps a strategy only where its fused graph plans less than its fallback's (all ->
  balanced -> none, runtime/pipeline.py);
- planned: the memory plan's peak (`memory_report()["peak_bytes"]`: params, optimizer
  state, inputs and the arena, kernel scratch included), real: what the executable holds
  (`real_bytes`), and their ratio; held: what the whole step holds, measured from its
  arrays (`held_bytes`: params, optimizer state, gradient buffers, every cached
  executable's arena and constants; inputs not counted), and held/plan (below 1 where the
  plan counts the params and state twice, old and new, which in-place updates share);
- rss: peak RSS of the process, and how much of it came after the imports, the model and
  the batch (compile and run); xtorch: rss over the model's torch row's. `real` counts the
  params and optimizer state twice, as a step holds them: those it reads and, as
  `real_results`, those it writes;
- step: median ms per training step; compile: seconds to compile;
  each also as a ratio to the model's `none` row (xnone; rows are separate processes, so
  on a loaded machine the ratio is only as steady as the load);
- kernels: distinct kernel functions LLVM compiles (what compile time grows with);
- matmuls: `kernel.matmul` ops in the compiled graph (recomputation adds some);
- attn bwd: fused attention backward kernels (`kernel.attention_grad`, one per block when
  the recomputed graph lets `fuse` form them; otherwise 5 matmuls each and the scores).
A torch row has no plan, compile or kernels ("-").
"""

from __future__ import annotations

import argparse
import importlib.util
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
# issue 36's GPT-2-small body: benchmarks/gpt.py's Gpt, 85.4M params with this vocab
GPT2 = {"vocab": 65, "n_embd": 768, "n_head": 12, "n_layer": 12, "block": 256}
GPT2_BATCH, ADAMW_LR = 4, 1e-3
ADAMW = ("gpt2",)  # models trained with AdamW; the others with SGD, momentum 0.9
TWINS = ("gpt2",)  # models with a PyTorch twin (a `torch` row)
STEPS = {"gpt2": 2}  # timed steps after the first call, where not the default


def vm_hwm() -> int:
    """The process's peak resident set size in bytes (Linux: /proc/self/status VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def vm_rss() -> int:
    """The process's resident set size now, in bytes (0 where /proc has no VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def reset_hwm() -> bool:
    """Reset VmHWM to the RSS now (Linux >= 4.0); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def gpt_module():
    """benchmarks/gpt.py (its folder is on sys.path when this file runs as a script)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import gpt

    return gpt


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

    if name == "gpt2":
        gpt = gpt_module()
        ((x, y),) = gpt.batches(GPT2["vocab"], GPT2_BATCH, GPT2["block"], 1)
        return gpt.Gpt(**GPT2), (x, y)
    if name == "mlp":
        depth, width, n = (8, 256, 128) if quick else (16, 512, 256)
        model, shape = Mlp(depth, width), (n, width)
    elif name == "cnn":
        model, shape = Cnn(), (64, 1, 8, 8)
    elif name == "gpt":
        layers, d, t, n = (2, 64, 64, 8) if quick else (4, 128, 128, 16)
        model, shape = Gpt(layers, d, 4), (n, t, d)
    else:
        raise SystemExit(f"unknown model {name!r}: one of mlp, cnn, gpt, gpt2")
    rng = np.random.default_rng(0)
    return model, (rng.standard_normal(shape).astype(np.float32),
                   rng.integers(0, 10, shape[0]))


def describe(name: str, quick: bool) -> str:
    return {"mlp": "MLP 8x256 b128" if quick else "MLP 16x512 b256",
            "cnn": "digits CNN b64",
            "gpt": "GPT 2x64 T64 b8" if quick else "GPT 4x128 T128 b16",
            "gpt2": "GPT-2 body 12x768 T256 b4"}[name]


def loss_and_optimizer(name: str):
    """The loss function and the ember optimizer `name` trains with."""
    from ember import nn, optim

    loss = gpt_module().lm_loss if name == "gpt2" else nn.functional.cross_entropy
    if name in ADAMW:
        return loss, optim.AdamW(lr=ADAMW_LR)
    return loss, optim.SGD(lr=0.01, momentum=0.9)


# -- one row, in its own process -------------------------------------------------------------

def row(name: str, strategy: str, quick: bool, steps: int) -> dict:
    import ember as em
    from ember.backends.cpu import codegen

    em.seed(0)
    model, (x, y) = build(name, quick)
    loss, optimizer = loss_and_optimizer(name)
    base = vm_hwm()
    step = em.compile_train_step(model, loss, optimizer, backend="cpu", recompute=strategy)
    step(x, y)  # compiles, then runs once
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t)
    report = step.memory_report()
    return {"model": name, "strategy": strategy, "opt": "AdamW" if name in ADAMW else "SGD-m",
            "ran": step.graph.attributes.get("ember.recompute_strategy", "none"),
            "kernels": codegen.kernel_count(codegen.plan(step.graph)),
            "planned": report["peak_bytes"],
            "real": report["real_bytes"], "held": report["held_bytes"],
            "rss": vm_hwm(), "rss_base": base,
            "step_ms": statistics.median(times) * 1e3, "compile_s": step.compile_seconds,
            "matmuls": sum(op.name in ("kernel.matmul", "ember.matmul")
                           for op in step.graph.walk()),
            "attn_bwd": sum(op.name == "kernel.attention_grad" for op in step.graph.walk())}


def torch_row(name: str, steps: int) -> dict:
    """The PyTorch eager twin of `name`'s model (same weights, batch and AdamW): one untimed
    step, then `steps` timed. The ember model is freed and VmHWM reset before training."""
    import gc

    import torch

    import ember as em

    gpt = gpt_module()
    em.seed(0)
    model, (x, y) = build(name, False)
    twin = gpt.torch_twin(model)
    del model
    gc.collect()
    reset = reset_hwm()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.AdamW(twin.parameters(), lr=ADAMW_LR)
    base = vm_hwm()

    def one() -> None:
        opt.zero_grad(set_to_none=True)
        gpt.torch_loss(twin, xt, yt).backward()
        opt.step()

    one()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        one()
        times.append(time.perf_counter() - t)
    return {"model": name, "strategy": "torch", "opt": "AdamW", "ran": "eager",
            "kernels": None, "planned": None, "real": None, "held": None, "rss": vm_hwm(),
            "rss_base": base, "hwm_reset": reset, "threads": torch.get_num_threads(),
            "step_ms": statistics.median(times) * 1e3, "compile_s": None, "matmuls": None,
            "attn_bwd": None}


def run_row(name: str, strategy: str, quick: bool, steps: int) -> dict:
    """`row` (`torch_row` for strategy `torch`) in a fresh interpreter with an empty
    compile cache."""
    with tempfile.TemporaryDirectory() as cache:
        cmd = [sys.executable, __file__, "--row", name, strategy, "--steps", str(steps)]
        out = subprocess.run(cmd + (["--quick"] if quick else []), capture_output=True,
                             text=True, env={**os.environ, "EMBER_CACHE_DIR": cache})
    if out.returncode:
        raise RuntimeError(f"{name} / {strategy} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict], quick: bool) -> str:
    """One line per row; `xnone`: the step and compile time over the same model's `none` row
    (issue 13 bounds both at 1.5x); `xtorch`: the rss over the model's `torch` row's."""
    none = {r["model"]: r for r in rows if r["strategy"] == "none"}
    twin = {r["model"]: r for r in rows if r["strategy"] == "torch"}

    def over(r: dict, key: str, by: dict, width: int = 7) -> str:
        base = by.get(r["model"])
        if base is None or r[key] is None or base[key] is None or (by is twin and base is r):
            return f"{'-':>{width}}"
        return f"{r[key] / base[key]:>{width}.2f}"

    def num(v, width: int, spec: str = "", scale: int = 1) -> str:
        if v is None:
            return f"{'-':>{width}}"
        return f"{v / scale if scale != 1 else v:>{width}{spec}}"

    head = (f"{'model':<27}{'opt':<7}{'strategy':<10}{'ran':<10}{'planned MiB':>12}"
            f"{'real MiB':>10}{'real/plan':>10}{'held MiB':>10}{'held/plan':>10}"
            f"{'rss MiB':>9}{'(+run)':>8}{'xtorch':>8}"
            f"{'step ms':>9}{'xnone':>7}{'compile s':>10}{'xnone':>7}{'kernels':>8}"
            f"{'matmuls':>8}{'attn bwd':>9}")
    lines = [head]
    for r in rows:
        ratio = None if r["planned"] is None else r["real"] / r["planned"]
        held = None if r["planned"] is None else r["held"] / r["planned"]
        lines.append(f"{describe(r['model'], quick):<27}{r.get('opt', 'SGD-m'):<7}"
                     f"{r['strategy']:<10}{r['ran']:<10}{num(r['planned'], 12, '.1f', MIB)}"
                     f"{num(r['real'], 10, '.1f', MIB)}{num(ratio, 10, '.2f')}"
                     f"{num(r['held'], 10, '.1f', MIB)}{num(held, 10, '.2f')}"
                     f"{r['rss'] / MIB:>9.0f}{(r['rss'] - r['rss_base']) / MIB:>8.0f}"
                     f"{over(r, 'rss', twin, 8)}{r['step_ms']:>9.1f}"
                     f"{over(r, 'step_ms', none)}{num(r['compile_s'], 10, '.2f')}"
                     f"{over(r, 'compile_s', none)}{num(r['kernels'], 8)}"
                     f"{num(r['matmuls'], 8)}{num(r['attn_bwd'], 9)}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller MLP and GPT, fewer steps")
    ap.add_argument("--models", default="mlp,cnn,gpt", help="of mlp, cnn, gpt, gpt2")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps per row, after the first (default 10, 3 with --quick, "
                         "2 for gpt2)")
    ap.add_argument("--torch", action=argparse.BooleanOptionalAction, default=None,
                    help="a PyTorch eager row for each model with a twin (gpt2); default: "
                         "when torch is importable")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    ap.add_argument("--row", nargs=2, metavar=("MODEL", "STRATEGY"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    def steps(name: str) -> int:
        return args.steps or STEPS.get(name) or (3 if args.quick else 10)

    if args.row:
        name, strategy = args.row
        print(json.dumps(torch_row(name, steps(name)) if strategy == "torch"
                         else row(name, strategy, args.quick, steps(name))))
        return
    from ember.backends.cpu.machine import host

    models = args.models.split(",")
    with_torch = args.torch
    if with_torch is None:
        with_torch = importlib.util.find_spec("torch") is not None
    elif with_torch and importlib.util.find_spec("torch") is None:
        raise SystemExit("--torch: torch is not installed")
    print(f"# cpu backend on {host.host_cpu()}, {host.num_threads()} threads, timed steps "
          f"per row after the first: {', '.join(f'{m} {steps(m)}' for m in models)}; "
          "each row in a fresh process")
    rows = []
    for name in models:
        todo = args.strategies.split(",") + (["torch"] if with_torch and name in TWINS else [])
        for strategy in todo:
            rows.append(run_row(name, strategy, args.quick, steps(name)))
            print(f"# {name} {strategy}: done", file=sys.stderr, flush=True)
    print(table(rows, args.quick))
    for r in rows:
        if r["strategy"] == "torch":
            print(f"# {r['model']} torch: {r['threads']} threads, VmHWM "
                  f"{'reset' if r['hwm_reset'] else 'NOT reset (the ember model counts)'} "
                  "after the twin was built and the ember model freed")
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
