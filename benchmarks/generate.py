"""Tokens/s of KV-cache generation: examples/generate.py (a prefill graph and one decode
graph, compiled) against PyTorch eager with the same cache and the same weights.

    python benchmarks/generate.py [--tokens 100] [--configs A,B] [--block 256] [--rounds 5]

Each contender generates `tokens` greedy tokens after a short prompt, whole generations
timed in interleaved rounds after a warm-up (timing.py). PyTorch's cache is preallocated
and written in place (`cache[:, :, pos] = k`), attending over `cache[:, :, :pos + 1]`;
both produce the same tokens (checked). PyTorch runs on its default threads and on one (on
a loaded machine its spinning OpenMP threads can make it slower with more); the ratio is
against the faster of the two. Also printed: the process's resident memory
before and after the timed rounds (it should not grow with the tokens), and where a decode
call's time goes on the cpu backend (its kernels, from `profile`, and the rest: the
per-call overhead).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import numpy as np
import timing
from gpt import CONFIGS, torch_twin

import ember as em

_spec = importlib.util.spec_from_file_location(
    "generate_example", Path(__file__).resolve().parents[1] / "examples" / "generate.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

PROMPT = "To be, or not to be, that is the question"


def rss_mb() -> float:
    """The resident set now (not the peak), in MiB."""
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def torch_generator(twin, block: int):
    """`generate(prompt [B, T], tokens)` of the torch twin with a preallocated KV cache."""
    import torch
    import torch.nn.functional as F

    def run_block(blk, x, cache, pos: int):
        """x [B, n, d] at positions pos.. through `blk`, its keys and values written to
        `cache` [2, B, heads, block, d_head]: the prompt (n > 1) attends causally to
        itself, a token to the cache up to itself."""
        a = blk.attn
        b, n, d = x.shape
        h = blk.ln1(x)
        q, k, v = (lin(h).view(b, n, a.heads, d // a.heads).transpose(1, 2)
                   for lin in (a.query, a.key, a.value))
        cache[0, :, :, pos:pos + n], cache[1, :, :, pos:pos + n] = k, v
        if n > 1:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, cache[0, :, :, :pos + 1],
                                               cache[1, :, :, :pos + 1])
        x = x + a.output(y.transpose(1, 2).reshape(b, n, d))
        return x + blk.proj(F.gelu(blk.fc(blk.ln2(x))))

    @torch.no_grad()
    def generate(prompt: np.ndarray, tokens: int) -> np.ndarray:
        idx = torch.from_numpy(prompt)
        b, t = idx.shape
        d, heads = twin.tok.weight.shape[1], twin.blocks[0].attn.heads
        caches = [torch.zeros(2, b, heads, block, d // heads) for _ in twin.blocks]
        x, pos, out = twin.tok(idx) + twin.pos(torch.arange(t)), 0, [idx]
        for step in range(tokens):
            for blk, cache in zip(twin.blocks, caches):
                x = run_block(blk, x, cache, pos)
            token = twin.head(twin.norm(x[:, -1])).argmax(-1)
            out.append(token[:, None])
            pos += x.shape[1]
            if step + 1 < tokens:
                x = twin.tok(token[:, None]) + twin.pos(torch.tensor([pos]))
        return torch.cat(out, 1).numpy()

    return generate


def decode_split(gen) -> tuple[float, float]:
    """(seconds per decode call, seconds in its kernels) on the warm decode graph."""
    prompt = example.encode(PROMPT)[None]
    _, caches = gen.prefill(prompt)
    token, pos = prompt[:, -1], np.array(prompt.shape[1], np.int64)
    kernels = sum(s for _, s in gen.decode.profile(token, pos, *caches, repeat=50))
    call = timing.median_time(lambda: gen.decode(token, pos, *caches), 200)
    return call, kernels


def on_threads(fn, threads: int):
    """fn run with torch on `threads` threads: on a loaded machine torch's spinning OpenMP
    threads can cost it more than one thread would, so both are timed."""
    import torch

    def run():
        was = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return fn()
        finally:
            torch.set_num_threads(was)
    return run


def bench(config: str, tokens: int, block: int, rounds: int, threads: list[int]) -> dict:
    em.seed(0)
    gpt = example.Gpt(vocab=len(example.CHARS), n_head=4, block=block, **CONFIGS[config])
    gen = example.Generator(gpt)
    theirs = torch_generator(torch_twin(gpt), block)
    prompt = example.encode(PROMPT)[None]
    start = time.perf_counter()
    ours = gen.generate(prompt, tokens)  # compiles: the warm-up
    first = time.perf_counter() - start
    same = np.array_equal(ours, theirs(prompt, tokens))
    before = rss_mb()
    fns = {"ember": lambda: gen.generate(prompt, tokens)}
    fns.update({n: on_threads(lambda: theirs(prompt, tokens), n) for n in threads})
    rates = {k: tokens / s for k, s in timing.interleaved(fns, 1, rounds).items()}
    call, kernels = decode_split(gen)
    return dict(config=config, rates=rates, first=first, compiles=gen.compiles, same=same,
                before=before, after=rss_mb(), call=call, kernels=kernels)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--configs", default="A,B")
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import torch

    threads = sorted({torch.get_num_threads(), 1}, reverse=True)
    print(f"{args.tokens} greedy tokens after a {len(PROMPT)}-char prompt, context "
          f"{args.block}, batch 1; torch {torch.__version__} eager; tokens/s, median of "
          f"{args.rounds} interleaved rounds")
    torch_cols = "".join(f"{f'torch {n} thr':>12}" for n in threads)
    print(f"{'config':<7}{'ember':>8}{torch_cols}{'ratio':>7}{'compiles':>9}{'first s':>8}"
          f"{'same':>6}{'RSS MiB before/after':>22}{'decode us':>10}{'kernels us':>11}")
    rows = [bench(c, args.tokens, args.block, args.rounds, threads)
            for c in args.configs.split(",")]
    ratios = []
    for r in rows:
        rates = r["rates"]
        ratios.append(rates["ember"] / max(rates[n] for n in threads))
        print(f"{r['config']:<7}{rates['ember']:>8.0f}"
              + "".join(f"{rates[n]:>12.0f}" for n in threads)
              + f"{ratios[-1]:>7.2f}{r['compiles']:>9}{r['first']:>8.2f}"
              f"{'yes' if r['same'] else 'NO':>6}{r['before']:>13.0f} / {r['after']:<7.0f}"
              f"{r['call'] * 1e6:>10.0f}{r['kernels'] * 1e6:>11.0f}")
    mean = statistics.geometric_mean(ratios)
    print(f"ratio = ember / the faster torch (geometric mean {mean:.2f}); decode us - kernels "
          "us = the per-call overhead of a compiled call")


if __name__ == "__main__":
    main()
