"""Compile time against depth: issue 14's "Must show".

Run: `python benchmarks/compile.py` (`--full` adds 16 layers, `--layers 1,2,4`, `--no-torch`,
`--json`). The model is benchmarks/dp.py's char-level `Gpt` (n_embd 64, 4 heads, T 64,
vocab 65, batch 16) trained with AdamW on `lm_loss`, for 1, 2, 4 and 8 layers. Each
measurement runs in a fresh process, so nothing is warm but the disk:
- first: the first call of `compile_train_step`'s step with EMBER_CACHE_DIR a new, empty
  directory: trace, IR passes, backend (plan, emit, LLVM), one step; split into the IR
  passes (`stages.timings`) and the backend (the executable's `timings["total"]`);
- cached load: the compile in a later process on the same cache directory (stage cache and
  object cache hit: trace, key, read the final graph back, load the object code), the
  median of `--cached-runs` such processes (3), and their first call (load and one step);
- torch: torch.compile's first compiled training step (forward + backward + AdamW) of the
  same GPT in PyTorch, less one eager step, with an empty inductor cache (where torch is
  installed), and ember's first compile over it.
`x2` is the growth of the first compile per doubling of depth (linear: 2.0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

N_EMBD, N_HEAD, T, BATCH, VOCAB = 64, 4, 64, 16, 65


def batch() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).integers(0, VOCAB, (BATCH, T))
    return x, np.roll(x, -1, axis=1)


# -- one measurement, in its own process ---------------------------------------------------

def ember_row(layers: int) -> dict:
    """Compile and run one step; what the compile cost and whether the caches hit."""
    import ember as em
    from ember import optim

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpt import Gpt, lm_loss

    em.seed(0)
    model = Gpt(vocab=VOCAB, n_embd=N_EMBD, n_head=N_HEAD, n_layer=layers, block=T)
    step = em.compile_train_step(model, lm_loss, optim.AdamW(lr=1e-3), backend="cpu")
    x, y = batch()
    start = time.perf_counter()
    step(x, y)
    first_call = time.perf_counter() - start
    entry = step._last
    return {"compile_s": entry.compile_seconds, "first_call_s": first_call,
            "passes_s": sum(t for _, t in entry.stages.timings),
            "backend_s": entry.run.timings.get("total", 0.0),
            "stages_cached": entry.stages.cached, "object_cached": entry.run.cached,
            "ops": sum(1 for _ in entry.graph.walk())}


def torch_row(layers: int) -> dict:
    """torch.compile's first training step of the same GPT, less one eager step."""
    import torch
    from gpt import Gpt, torch_twin

    import ember as em

    torch.set_num_threads(os.cpu_count() or 1)
    em.seed(0)
    model = torch_twin(Gpt(vocab=VOCAB, n_embd=N_EMBD, n_head=N_HEAD, n_layer=layers, block=T))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (torch.from_numpy(a) for a in batch())

    def train_step(m):
        loss = torch.nn.functional.cross_entropy(m(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()

    start = time.perf_counter()
    train_step(model)
    eager = time.perf_counter() - start
    compiled = torch.compile(model)
    start = time.perf_counter()
    train_step(compiled)
    return {"torch_compile_s": time.perf_counter() - start - eager}


def measure(kind: str, layers: int, cache: str | None = None) -> dict:
    """One row's measurement in a fresh process (EMBER_CACHE_DIR=cache for ember)."""
    env = {**os.environ, "EMBER_CACHE": "1"}
    if cache:  # ember's, and torch inductor's (whose first compile is then cold too)
        env["EMBER_CACHE_DIR"] = env["TORCHINDUCTOR_CACHE_DIR"] = cache
    done = subprocess.run([sys.executable, __file__, "--row", kind, "--layers", str(layers)],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{kind} row, {layers} layers, failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def rows(layer_counts: list[int], with_torch: bool, cached_runs: int = 3) -> list[dict]:
    table = []
    for layers in layer_counts:
        with tempfile.TemporaryDirectory(prefix="ember-compile-") as cache:
            first = measure("ember", layers, cache)
            cached = [measure("ember", layers, cache) for _ in range(max(1, cached_runs))]
        loads = sorted(c["compile_s"] for c in cached)
        row = {"layers": layers, **first, "cached_s": loads[len(loads) // 2],
               "cached_runs_s": loads,
               "cached_call_s": sorted(c["first_call_s"] for c in cached)[len(loads) // 2],
               "cache_hit": all(c["stages_cached"] and c["object_cached"] for c in cached)}
        if with_torch:
            with tempfile.TemporaryDirectory(prefix="torch-compile-") as cache:
                row.update(measure("torch", layers, cache))
        table.append(row)
        print(f"  {layers} layers: first {first['compile_s']:.2f} s", file=sys.stderr)
    return table


def render(table: list[dict]) -> str:
    torch = "torch_compile_s" in table[0]
    head = ["layers", "ops", "first s", "x2", "passes s", "backend s", "cached load",
            "load+step", "hit"]
    head += ["torch.compile s", "ember/torch"] if torch else []
    lines = ["  ".join(f"{h:>9}" for h in head)]
    prev = None
    for r in table:
        growth = (f"{r['compile_s'] / prev['compile_s']:.2f}"
                  if prev and r["layers"] == 2 * prev["layers"] else "")
        cells = [r["layers"], r["ops"], f"{r['compile_s']:.2f}", growth, f"{r['passes_s']:.2f}",
                 f"{r['backend_s']:.2f}", f"{r['cached_s']:.3f}", f"{r['cached_call_s']:.3f}",
                 "yes" if r["cache_hit"] else "NO"]
        if torch:
            cells += [f"{r['torch_compile_s']:.2f}",
                      f"{r['compile_s'] / r['torch_compile_s']:.2f}"]
        lines.append("  ".join(f"{c:>9}" for c in cells))
        prev = r
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=None, help="comma-separated depths (default 1,2,4,8)")
    ap.add_argument("--full", action="store_true", help="also 16 layers")
    ap.add_argument("--no-torch", action="store_true", help="skip torch.compile")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--cached-runs", type=int, default=3,
                    help="processes that load from the warm cache (their median is shown)")
    ap.add_argument("--row", choices=("ember", "torch"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        layers = int(args.layers)
        print(json.dumps(ember_row(layers) if args.row == "ember" else torch_row(layers)))
        return
    counts = ([int(n) for n in args.layers.split(",")] if args.layers
              else [1, 2, 4, 8] + ([16] if args.full else []))
    try:
        import torch  # noqa: F401
        with_torch = not args.no_torch
    except ImportError:
        with_torch = False
    table = rows(counts, with_torch, args.cached_runs)
    print(json.dumps(table, indent=1) if args.json else render(table))


if __name__ == "__main__":
    main()
