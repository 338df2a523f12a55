"""benchmarks/run.py's GPT rows: char-level GPT training steps (AdamW; benchmarks/gpt.py),
config A (n_embd 64, 4 heads, 2 layers), B (n_embd 128, 4 layers) and G, the GPT-2-small
body (n_embd 768, 12 heads, 12 layers, batch 4), against PyTorch eager and torch.compile on
the same initial weights, interleaved; in bf16-mixed also against ember's f32 step and
PyTorch under `torch.autocast("cpu", dtype=torch.bfloat16)`."""

from __future__ import annotations

import importlib.util
import time

import numpy as np
from timing import calls_for, interleaved, median_time, torch_train

GPT_BATCH, GPT_LR = 16, 1e-3


# the GPT-2-small body (issue 36's; 85.4M params with this vocab), batch 4
GPT2_BODY, GPT2_BATCH = {"n_embd": 768, "n_layer": 12, "n_head": 12}, 4


def bench_gpt(rows: list, shapes: list[str], precisions: list[str]) -> None:
    """`shapes`: config and sequence length, `A64` (config A, T 64), `B128`, `A256`, `G256`
    (the GPT-2-small body); each in every precision."""
    for shape in shapes:
        for precision in precisions:
            _one_gpt(rows, shape[0], int(shape[1:]), precision)


def _one_gpt(rows: list, config: str, t: int, precision: str) -> None:
    """One GPT training step, ember against PyTorch eager and torch.compile on copies of
    the same initial weights (in bf16-mixed also against ember's f32 step, PyTorch under
    autocast), timed in interleaved blocks."""
    from gpt import CONFIGS, Gpt, batches, lm_loss

    import ember as em
    from ember import optim

    em.seed(0)
    shape = GPT2_BODY if config == "G" else {"n_head": 4, **CONFIGS[config]}
    model = Gpt(vocab=65, block=t, **shape)
    ((x, y),) = batches(65, GPT2_BATCH if config == "G" else GPT_BATCH, t, 1)
    # before ember's first update changes the weights
    others = torch_gpt_steps(model, x, y, precision != "32")
    steps, first = {}, 0.0
    for p in dict.fromkeys((precision, "32")):  # the f32 step too, where it is the baseline
        start = time.perf_counter()
        steps[p] = em.compile_train_step(model, lm_loss, optim.AdamW(lr=GPT_LR), backend="cpu",
                                         precision=p)
        steps[p](x, y)
        if p == precision:
            first = time.perf_counter() - start
    step = steps[precision]
    fns, failed = {"ember": lambda: step(x, y)}, []
    if precision != "32":
        fns["ember f32"] = lambda: steps["32"](x, y)
    for label, fn in others.items():
        try:
            median_time(fn, 1, 3)  # warm up (and compile)
            fns[label] = fn
        except Exception as e:  # noqa: BLE001  (a failing baseline is reported, not fatal)
            failed.append((f"  vs {label}", f"failed: {type(e).__name__}", "", "", ""))
    why = "no JAX twin of the GPT" if importlib.util.find_spec("jax") else "jax not installed"
    failed.append(("  vs jax jit", "skipped", why, "", ""))
    times = interleaved(fns, calls_for(median_time(fns["ember"], 1, 3), 0.1))
    t_em = times.pop("ember")
    batch = GPT2_BATCH if config == "G" else GPT_BATCH
    rows.append((f"step GPT {config} T{t} b{batch} {precision}", f"{t_em * 1e3:9.2f} ms",
                 f"AdamW, {model.num_params():,} params", "", f"compile {first:.1f} s"))
    rows += [(f"  vs {label}", f"{t2 * 1e3:9.2f} ms", f"x{t2 / t_em:5.2f}", "", "")
             for label, t2 in times.items()] + failed


def torch_gpt_steps(model, x: np.ndarray, y: np.ndarray, autocast: bool = False) -> dict:
    """{label: step} of the GPT's PyTorch twin, eager and under torch.compile, each with a
    copy of `model`'s current weights and AdamW (the forward under bf16 autocast where
    `autocast`); empty without PyTorch."""
    if importlib.util.find_spec("torch") is None:
        return {}
    import torch
    from gpt import torch_loss, torch_twin

    def loss(twin, a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return torch_loss(twin, a, b)

    steps = {}
    for label, compile_ in (("torch eager", False), ("torch.compile", True)):
        twin = torch_twin(model)
        opt = torch.optim.AdamW(twin.parameters(), lr=GPT_LR)
        steps[label + (" autocast" if autocast else "")] = torch_train(
            lambda a, b, twin=twin: loss(twin, a, b), opt, compile_, x, y)
    return steps
