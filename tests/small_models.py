"""Small models that several test folders train and plan: one copy each."""

import ember as em
from ember import nn
from ember.ir import numpy_dtype

F = nn.functional


class ToDtype(em.ModuleMapper):
    """A model's float params and buffers as `dtype` ("bf16", "f16", ...), ids kept."""

    def __init__(self, dtype: str):
        self.dtype = numpy_dtype(dtype)

    def map_float(self, param):
        return param.map(lambda a: a.astype(self.dtype))

    map_buffer = map_float


class Fn(nn.Module):
    """A module whose forward is the function `fn`, to trace or compile one call."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class MeanPool(nn.Module):
    """Mixes over T: a mean over the sequence, then a Linear (inputs [B, T, 6])."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(F.relu(self.fc(x)).mean(axis=1))


class Block(nn.Module):
    """A pre-norm transformer block (LayerNorm, causal attention, an MLP, residuals) and a
    classifier head on its mean over the sequence."""

    def __init__(self, d: int = 32):
        super().__init__()
        self.n1, self.attn = nn.LayerNorm(d), nn.MultiHeadAttention(d, 4, causal=True)
        self.n2, self.f1, self.f2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        x = x + self.f2(F.gelu(self.f1(self.n2(x))))
        return self.head(x.mean(axis=1))
