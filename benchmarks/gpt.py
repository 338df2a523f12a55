"""A char-level GPT in ember and its PyTorch twin: what benchmarks/run.py and dp.py time and
tests/runtime/test_gpt_parity.py holds equal to PyTorch step by step.

Pre-LN blocks of causal multi-head attention (separate q/k/v/out Linear(d, d) with bias, as
ember's nn.MultiHeadAttention has) and a GELU MLP of 4x width, a final LayerNorm and a
linear head. `torch_twin(model)` builds the same network in PyTorch holding a copy of the
ember model's weights, so both start from identical parameters.
"""

from __future__ import annotations

import numpy as np

from ember import nn

CONFIGS = {"A": {"n_embd": 64, "n_layer": 2}, "B": {"n_embd": 128, "n_layer": 4}}


class Gpt(nn.Module):
    def __init__(self, vocab: int = 65, n_embd: int = 128, n_head: int = 4, n_layer: int = 2,
                 block: int = 64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
        self.blocks = [Block(n_embd, n_head) for _ in range(n_layer)]
        self.norm, self.head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab)
        self.block = block

    def forward(self, idx):
        x = self.tok(idx) + self.pos(np.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiHeadAttention(n_embd, n_head, causal=True)
        self.fc, self.proj = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(nn.functional.gelu(self.fc(self.ln2(x))))


def lm_loss(logits, y):
    b, t, v = logits.shape
    return nn.functional.cross_entropy(logits.reshape(b * t, v), y.reshape(b * t))


def batches(vocab: int, batch: int, t: int, n: int, seed: int = 0) -> list[tuple]:
    """`n` (tokens, next tokens) batches of random text: int64 [batch, t] each."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.integers(0, vocab, (batch, t + 1))
        out.append((x[:, :-1].copy(), x[:, 1:].copy()))
    return out


def torch_twin(model: Gpt):
    """The PyTorch module of the same architecture, holding a copy of `model`'s weights
    (ember's Linear weights are [d_in, d_out], torch's [d_out, d_in])."""
    import torch
    import torch.nn.functional as F

    class Attention(torch.nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.query, self.key, self.value, self.output = (torch.nn.Linear(d, d)
                                                             for _ in range(4))

        def forward(self, x):
            b, t, d = x.shape

            def split(lin):
                return lin(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)

            y = F.scaled_dot_product_attention(split(self.query), split(self.key),
                                               split(self.value), is_causal=True)
            return self.output(y.transpose(1, 2).reshape(b, t, d))

    class TorchBlock(torch.nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.attn = Attention(d, heads)
            self.fc, self.proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.proj(F.gelu(self.fc(self.ln2(x))))

    class TorchGpt(torch.nn.Module):
        def __init__(self, vocab, d, heads, layers, block):
            super().__init__()
            self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(block, d)
            self.blocks = torch.nn.ModuleList(TorchBlock(d, heads) for _ in range(layers))
            self.norm, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))

    vocab, d = model.tok.weight.shape
    twin = TorchGpt(vocab, d, model.blocks[0].attn.num_heads, len(model.blocks), model.block)
    _copy_weights(model.state_dict(), twin)
    return twin


def _copy_weights(values: dict[str, np.ndarray], twin) -> None:
    """ember's values into the torch module whose submodules have the same paths."""
    import torch

    names = {torch.nn.Linear: ("weight", "bias"), torch.nn.LayerNorm: ("gamma", "beta"),
             torch.nn.Embedding: ("weight",)}
    with torch.no_grad():
        for path, module in twin.named_modules():
            ours = names.get(type(module))
            for theirs, ours_name in zip(("weight", "bias"), ours or ()):
                v = values[f"{path}.{ours_name}"]
                if isinstance(module, torch.nn.Linear) and theirs == "weight":
                    v = v.T
                getattr(module, theirs).copy_(torch.from_numpy(np.ascontiguousarray(v)))


def torch_loss(twin, x, y):
    """`lm_loss` of the torch twin on torch tensors."""
    import torch.nn.functional as F

    logits = twin(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
