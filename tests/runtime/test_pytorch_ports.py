"""Four models written the way PyTorch code is written — a nanoGPT-style GPT, a ViT, a
BERT-style encoder taking (input_ids, attention_mask), a small U-Net — run as ember models
with only their import lines changed: each trains 20 steps from the same weights (loaded
with `em.load_torch`, which transposes Linear weights) with losses within 1e-5 of the
same PyTorch model's, in float32."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em

torch = pytest.importorskip("torch")

TORCH_IMPORTS = """
import math
import torch
from torch import nn
from torch.nn import functional as F
"""
EMBER_IMPORTS = """
import math
import ember as torch
from ember import nn
from ember.nn import functional as F
"""

MODELS = '''
class SelfAttention(nn.Module):
    def __init__(self, d, heads, causal):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head, self.n_embd, self.causal = heads, d, causal

    def forward(self, x, attention_mask=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.causal:
            att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf"))
        if attention_mask is not None:
            att = att.masked_fill(attention_mask[:, None, None, :] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, d, heads, causal):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads, causal)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, attention_mask=None):
        x = x + self.attn(self.ln_1(x), attention_mask)
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=17, block=8, d=16, heads=2, layers=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList([Block(d, heads, True) for _ in range(layers)])
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        B, T = idx.size()
        x = self.wte(idx) + self.wpe(torch.arange(0, T))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)[:, -1, :])  # the next token after the sequence


class ViT(nn.Module):
    def __init__(self, image=8, patch=4, d=16, heads=2, layers=2, classes=5):
        super().__init__()
        n = (image // patch) ** 2
        self.patch_embed = nn.Conv2d(3, d, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.zeros(1, n + 1, d))
        self.blocks = nn.ModuleList([Block(d, heads, False) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


class Bert(nn.Module):
    def __init__(self, vocab=17, block=8, d=16, heads=2, layers=2, classes=3):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, d)
        self.position_embeddings = nn.Embedding(block, d)
        self.layer = nn.ModuleList([Block(d, heads, False) for _ in range(layers)])
        self.classifier = nn.Linear(d, classes)

    def forward(self, input_ids, attention_mask):
        T = input_ids.size(1)
        x = self.word_embeddings(input_ids) + self.position_embeddings(torch.arange(T))
        for layer in self.layer:
            x = layer(x, attention_mask)
        m = attention_mask.unsqueeze(-1)
        return self.classifier((x * m).sum(1) / m.sum(1))


class UNet(nn.Module):
    def __init__(self, c=4):
        super().__init__()
        self.down1 = nn.Conv2d(1, c, 3, padding=1)
        self.down2 = nn.Conv2d(c, 2 * c, 3, padding=1)
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.merge = nn.Conv2d(2 * c, c, 3, padding=1)
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x):
        skip = F.relu(self.down1(x))
        y = F.relu(self.down2(F.max_pool2d(skip, 2)))
        y = torch.cat([self.up(y), skip], dim=1)
        return self.out(F.relu(self.merge(y)))
'''


def models(imports: str) -> dict:
    namespace: dict = {}
    exec(compile(imports + MODELS, "<ported models>", "exec"), namespace)  # noqa: S102
    return namespace


TORCH, EMBER = models(TORCH_IMPORTS), models(EMBER_IMPORTS)
R = np.random.default_rng(0)
TOKENS = R.integers(0, 17, (6, 8))
MASK = (np.arange(8) < R.integers(3, 9, (6, 1))).astype(np.float32)
CASES = {  # name: (inputs, target, loss)
    "gpt": ((TOKENS,), R.integers(0, 17, 6), "cross_entropy"),
    "vit": ((R.standard_normal((6, 3, 8, 8)).astype(np.float32),), R.integers(0, 5, 6),
            "cross_entropy"),
    "bert": ((TOKENS, MASK), R.integers(0, 3, 6), "cross_entropy"),
    "unet": ((R.standard_normal((2, 1, 8, 8)).astype(np.float32),),
             R.standard_normal((2, 1, 8, 8)).astype(np.float32), "mse_loss"),
}
CLASSES = {"gpt": "GPT", "vit": "ViT", "bert": "Bert", "unet": "UNet"}
STEPS, LR = 20, 0.05


def torch_losses(model, inputs, target, loss: str) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    fn = getattr(torch.nn.functional, loss)
    xs = [torch.tensor(x) for x in inputs]
    y = torch.tensor(target)
    out = []
    for _ in range(STEPS):
        opt.zero_grad()
        value = fn(model(*xs), y)
        value.backward()
        opt.step()
        out.append(value.item())
    return out


@pytest.mark.parametrize("name", CASES)
def test_a_pytorch_model_ports_with_its_imports_changed(name):
    inputs, target, loss = CASES[name]
    torch.manual_seed(0)
    reference = TORCH[CLASSES[name]]()
    ours = EMBER[CLASSES[name]]()
    em.load_torch(ours, reference.state_dict())
    step = em.compile_train_step(ours, getattr(em.nn.functional, loss),
                                 em.optim.SGD(ours.parameters(), lr=LR),
                                 n_inputs=len(inputs))
    got = [float(step(*inputs, target)) for _ in range(STEPS)]
    want = torch_losses(reference, inputs, target, loss)
    assert got[-1] < got[0]  # it learns
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
