"""Why a recomputed training step compiles slower than the `none` one: for each
strategy, the compile time split into IR passes and backend stages, the kernel ops and
the distinct kernel bodies the cpu backend compiles (one LLVM function each,
backends/cpu/codegen.py `_kernel_key`), the planned peak, and which bodies exist only
under checkpointing (issue 13, Deliver 3: within 1.5x of none's compile time).

Run: `python benchmarks/compile_recompute.py` (`--quick` for a smaller GPT,
`--strategies none,all`, `--show N` prints N bodies found only under checkpointing,
`--steps K` times K interleaved steps per strategy in one process afterwards). The model
is the GPT block stack of benchmarks/memory.py (4 layers, n_embd 128, T 128, batch 16)
trained with AdamW. Each compile runs in a fresh process with an empty compile cache;
`cpu s` is that process's CPU time for it (steadier than wall time on a loaded machine),
and `xnone` its ratio to the `none` row's. "kernels" counts every op the executable runs,
"distinct" the functions it compiles for them.
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
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

STRATEGIES = ("none", "balanced", "min-cut", "all")
MIB = 1 << 20


def compile_step(strategy: str, quick: bool):
    """A compiled (and once run) GPT training step under `strategy`, and its batch."""
    from memory import build

    import ember as em
    from ember import optim

    em.seed(0)
    model, (x, y) = build("gpt", quick)
    step = em.compile_train_step(model, em.nn.functional.cross_entropy,
                                 optim.AdamW(lr=1e-3), backend="cpu", recompute=strategy)
    step(x, y)
    return step, (x, y)


def kernel_keys(step) -> Counter:
    """The kernel function key of each step of the step's executable, with its count."""
    from ember.backends.cpu.codegen import _kernel_key

    p = step._last.run.plan
    keys = Counter()
    for k, st in enumerate(p.steps):
        text, scratch, index = _kernel_key(st, k)
        marks = (" [scratch]" if scratch else "") + ("" if index is None else f" [step {index}]")
        keys[text + marks] += 1
    return keys


def row(strategy: str, quick: bool) -> dict:
    import ember  # noqa: F401  (imports are not compile time)

    t, cpu = time.perf_counter(), time.process_time()
    step, _ = compile_step(strategy, quick)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    entry = step._last
    passes = dict(entry.stages.timings)
    backend = dict(entry.run.timings)
    keys = kernel_keys(step)
    return {"strategy": strategy, "compile_s": step.compile_seconds, "wall_s": wall,
            "cpu_s": cpu,
            "passes_s": sum(passes.values()), "fuse_s": passes.get("fuse", 0.0),
            "backend": backend, "kernels": sum(keys.values()), "distinct": len(keys),
            "planned": step.memory_report()["peak_bytes"], "keys": list(keys)}


def run_row(strategy: str, quick: bool) -> dict:
    """`row` in a fresh interpreter with an empty compile cache."""
    with tempfile.TemporaryDirectory() as cache:
        cmd = [sys.executable, __file__, "--row", strategy] + (["--quick"] if quick else [])
        out = subprocess.run(cmd, capture_output=True, text=True,
                             env={**os.environ, "EMBER_CACHE_DIR": cache})
    if out.returncode:
        raise RuntimeError(f"{strategy} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def step_times(strategies: list[str], quick: bool, steps: int) -> dict[str, float]:
    """Median ms per step of each strategy, the strategies' steps interleaved."""
    made = {s: compile_step(s, quick) for s in strategies}
    times: dict[str, list[float]] = {s: [] for s in strategies}
    for _ in range(steps):
        for s, (step, (x, y)) in made.items():
            t = time.perf_counter()
            step(x, y)
            times[s].append(time.perf_counter() - t)
    return {s: statistics.median(v) * 1e3 for s, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--show", type=int, default=0, help="bodies only checkpointing has")
    ap.add_argument("--steps", type=int, default=0, help="interleaved timed steps")
    ap.add_argument("--row", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(json.dumps(row(args.row, args.quick)))
        return
    strategies = args.strategies.split(",")
    rows = [run_row(s, args.quick) for s in strategies]
    none = next((r for r in rows if r["strategy"] == "none"), None)
    ms = step_times(strategies, args.quick, args.steps) if args.steps else {}
    print(f"{'strategy':<10}{'kernels':>8}{'distinct':>9}{'only ckpt':>10}{'compile s':>10}"
          f"{'cpu s':>7}{'passes':>8}{'fuse':>7}{'backend':>8}{'optimize':>9}{'codegen':>8}"
          f"{'xnone':>7}{'planned MiB':>12}{'step ms':>9}")
    base = set(none["keys"]) if none else set()
    for r in rows:
        b = r["backend"]
        x = f"{r['cpu_s'] / none['cpu_s']:>7.2f}" if none else f"{'-':>7}"
        only = len(set(r["keys"]) - base)
        print(f"{r['strategy']:<10}{r['kernels']:>8}{r['distinct']:>9}{only:>10}"
              f"{r['compile_s']:>10.2f}{r['cpu_s']:>7.2f}{r['passes_s']:>8.2f}{r['fuse_s']:>7.2f}"
              f"{b.get('total', 0):>8.2f}{b.get('optimize', 0):>9.2f}{b.get('codegen', 0):>8.2f}"
              f"{x}{r['planned'] / MIB:>12.1f}{ms.get(r['strategy'], float('nan')):>9.1f}")
    for r in rows:
        extra = [k for k in r["keys"] if k not in base][:args.show]
        for k in extra:
            print(f"\n# {r['strategy']} only:\n{k}")


if __name__ == "__main__":
    main()
