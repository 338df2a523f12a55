"""Text generation with a KV cache from a handful of compiled graphs.

    python examples/generate.py --tokens 100 --prompt "To be, or not to be"
    python examples/generate.py --tokens 100 --temperature 0.8 --seed 1
    python examples/generate.py --train 300 --tokens 200 --prompt "To be"   # fit it first

The model is benchmarks/gpt.py's char-level `Gpt` (its weights drive both graphs, so a
trained `Gpt` generates as it is). Growing the context one token at a time would trace a
new graph for every length; instead two graphs run:

- PREFILL, compiled for a symbolic prompt length, `em.TensorSpec((batch, "T"), "i64")`:
  ember pads each prompt to a bucket (a power of two, at most the context) and its
  `pad-mask` pass keeps the padding out of every real position (causal attention hides it
  already), so one graph per bucket serves every prompt length and the logits are exact.
  It returns the logits and every layer's keys and values at each prompt position (ember
  cuts the padded ones off); `Generator.prefill` places them at the start of caches of the
  model's full context, `block`, zero past the prompt.
- DECODE, one graph: a token, its position `pos` (an i64 scalar) and the caches in; it
  writes the token's key and value at `pos` (a select on `arange == pos`), attends over
  the whole cache with the keys after `pos` masked, and returns the logits and the caches.

So a generation compiles (prompt buckets used) + 1 graphs, whatever its length.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import ember as em
from ember import nn, optim
from ember.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpt import CONFIGS, Gpt, lm_loss  # noqa: E402

CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # 65, as Gpt's vocab

TEXT = """To be, or not to be, that is the question:
Whether 'tis nobler in the mind to suffer
The slings and arrows of outrageous fortune,
Or to take arms against a sea of troubles
And by opposing end them. To die: to sleep;
No more; and by a sleep to say we end
The heart-ache and the thousand natural shocks
That flesh is heir to: 'tis a consummation
Devoutly to be wish'd.
"""  # what `--train` fits the model to (Hamlet, III.1)


def encode(text: str) -> np.ndarray:
    """Characters outside the vocabulary become spaces."""
    return np.array([CHARS.find(c) if c in CHARS else 1 for c in text], np.int64)


def decode_text(ids) -> str:
    return "".join(CHARS[int(i)] for i in ids)


def buckets(limit: int, smallest: int = 8) -> tuple[int, ...]:
    """Powers of two from `smallest`, then `limit` (the context) as the last."""
    sizes = [smallest]
    while sizes[-1] < limit:
        sizes.append(sizes[-1] * 2)
    return (*sizes[:-1], limit) if sizes[-1] > limit else tuple(sizes)


def _heads(x, lin: nn.Linear, heads: int):
    """[B, T, d] projected by `lin` and split to [B, heads, T, d / heads]."""
    y = lin(x)
    b, t, d = y.shape
    return y.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)


def _block(blk, x, attend):
    """One pre-LN block of `Gpt` (benchmarks/gpt.py Block's params) with the attention
    itself left to `attend(q, k, v) -> (y, k_cache, v_cache)`."""
    a = blk.attn
    h = blk.ln1(x)
    y, kc, vc = attend(*(_heads(h, lin, a.num_heads) for lin in (a.query, a.key, a.value)))
    b, _, t, dh = y.shape
    x = x + a.output(y.transpose(0, 2, 1, 3).reshape(b, t, a.num_heads * dh))
    return x + blk.proj(F.gelu(blk.fc(blk.ln2(x)))), kc, vc


class Prefill(nn.Module):
    """forward(idx [B, T] i64) -> (logits [B, T, vocab], k0, v0, k1, v1, ...: each layer's
    keys and values [B, heads, T, d_head])."""

    def __init__(self, gpt: Gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, idx):
        g, t = self.gpt, idx.shape[1]
        x = g.tok(idx) + g.pos(np.arange(t))
        caches = []

        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, causal=True), k, v

        for blk in g.blocks:
            x, kc, vc = _block(blk, x, attend)
            caches += [kc, vc]
        return (g.head(g.norm(x)), *caches)


class Decode(nn.Module):
    """forward(token [B] i64, pos i64 scalar, k0, v0, k1, v1, ...) -> (logits [B, vocab],
    the caches with the token's keys and values written at `pos`)."""

    def __init__(self, gpt: Gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, token, pos, *caches):
        g = self.gpt
        keys = np.arange(g.block)
        here = (pos == keys).reshape(g.block, 1)  # the cache row that `pos` writes
        seen = pos >= keys  # the keys this query attends to
        x = (g.tok(token) + g.pos(pos)).reshape(token.shape[0], 1, -1)
        out = []
        for i, blk in enumerate(g.blocks):
            def attend(q, k, v, kc=caches[2 * i], vc=caches[2 * i + 1]):
                kc, vc = F.where(here, k, kc), F.where(here, v, vc)
                return F.scaled_dot_product_attention(q, kc, vc, attn_mask=seen), kc, vc

            x, kc, vc = _block(blk, x, attend)
            out += [kc, vc]
        return (g.head(g.norm(x)).reshape(token.shape[0], -1), *out)


class Generator:
    """Greedy or temperature sampling from a `Gpt` through its prefill and decode graphs,
    compiled on first use (the prefill once per prompt bucket: `compiles` counts them)."""

    def __init__(self, gpt: Gpt, batch: int = 1, backend: str = "cpu",
                 sizes: tuple[int, ...] | None = None):
        """`sizes`: the prompt buckets (increasing, at most the context; default
        `buckets(block)`); a prompt longer than the last compiles for its exact length."""
        self.gpt, self.batch, self.backend, self.block = gpt, batch, backend, gpt.block
        self.sizes = buckets(self.block) if sizes is None else tuple(sizes)
        if self.sizes[-1] > self.block:
            raise ValueError(f"prompt buckets {self.sizes} exceed the model's context of "
                             f"{self.block}")
        self.prefill_fn = em.compile(Prefill(gpt), em.TensorSpec((batch, "T"), "i64"),
                                     backend=backend, buckets=self.sizes)
        self.decode = None

    @property
    def compiles(self) -> int:
        """Graphs compiled so far: one per prompt bucket used, and the decode graph."""
        return self.prefill_fn.compiles + (self.decode is not None)

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """(logits [B, vocab] after the prompt [B, T], the caches)."""
        b, t = prompt.shape
        if not 0 < t <= self.block:
            raise ValueError(f"the prompt has {t} tokens; the model's context holds 1 to "
                             f"{self.block}")
        if b != self.batch:
            raise ValueError(f"a batch of {b} prompts for a Generator of batch {self.batch}")
        logits, *keys_values = self.prefill_fn(np.asarray(prompt, np.int64))
        caches = []
        for kv in keys_values:  # [B, heads, T, d] at the start of [B, heads, block, d]
            cache = np.zeros(kv.shape[:2] + (self.block,) + kv.shape[3:], kv.dtype)
            cache[:, :, :t] = kv
            caches.append(cache)
        return logits[:, -1], caches

    def step(self, token: np.ndarray, pos: int, caches: list) -> tuple[np.ndarray, list]:
        """(logits [B, vocab] after `token` [B] at `pos`, the caches with it written)."""
        pos = np.array(pos, np.int64)
        if self.decode is None:
            self.decode = em.compile(Decode(self.gpt), token, pos, *caches,
                                     backend=self.backend)
        logits, *caches = self.decode(token, pos, *caches)
        return logits, caches

    def generate(self, prompt: np.ndarray, tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> np.ndarray:
        """The prompt [B, T] followed by `tokens` new ones: argmax at temperature 0, else
        sampled from softmax(logits / temperature) by a numpy RNG seeded with `seed`."""
        prompt = np.asarray(prompt, np.int64).reshape(self.batch, -1)
        t = prompt.shape[1]
        if t + tokens > self.block:
            raise ValueError(f"{t} prompt tokens + {tokens} new ones exceed the model's "
                             f"context of {self.block}")
        rng = np.random.default_rng(seed)
        out = [prompt]
        logits, caches = self.prefill(prompt)
        for i in range(tokens):
            out.append(choose(logits, temperature, rng)[:, None])
            if i + 1 < tokens:
                logits, caches = self.step(out[-1][:, 0], t + i, caches)
        return np.concatenate(out, axis=1)


def choose(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """The next token of each row [B] of logits [B, vocab]."""
    if temperature <= 0:
        return logits.argmax(-1)
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in p], np.int64)


def train(gpt: Gpt, steps: int, seed: int = 0) -> float:
    """Fit `gpt` to TEXT by AdamW on random windows (so the generated text means something);
    returns the last loss."""
    ids, rng = encode(TEXT * (2 + gpt.block // len(TEXT))), np.random.default_rng(seed)
    t = gpt.block  # every position the generation will use
    step = em.compile_train_step(gpt, lm_loss, optim.AdamW(lr=3e-3))
    loss = float("nan")
    for _ in range(steps):
        at = rng.integers(0, len(TEXT), 8)[:, None] + np.arange(t + 1)
        loss = step(ids[at[:, :-1]], ids[at[:, 1:]])
    return loss


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--prompt", default="To be, or not to be")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--seed", type=int, default=0, help="the weights' and the sampling's")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="A")
    ap.add_argument("--block", type=int, default=256, help="the context (cache) length")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--train", type=int, default=0, metavar="STEPS",
                    help="first fit the model to a passage of Hamlet for STEPS steps")
    args = ap.parse_args(argv)
    em.seed(args.seed)
    gpt = Gpt(vocab=len(CHARS), n_head=4, block=args.block, **CONFIGS[args.config])
    if args.train:
        print(f"trained {args.train} steps: loss {train(gpt, args.train, args.seed):.3f}")
    gen = Generator(gpt, backend=args.backend)
    start = time.perf_counter()
    ids = gen.generate(encode(args.prompt), args.tokens, args.temperature, args.seed)
    first = time.perf_counter() - start  # compiling included
    start = time.perf_counter()
    gen.generate(encode(args.prompt), args.tokens, args.temperature, args.seed)
    rate = args.tokens / (time.perf_counter() - start)
    print(decode_text(ids[0]))
    print(f"{args.tokens} tokens: {rate:.0f} tokens/s compiled ({first:.2f} s the first time, "
          f"compiling), {gen.compiles} compiles ({gen.prefill_fn.compiles} prefill + decode), "
          f"temperature {args.temperature}")


if __name__ == "__main__":
    main()
