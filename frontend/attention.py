"""MultiHeadAttention: q/k/v/output Linear projections around `nn.attention`."""

from __future__ import annotations

from . import functional as F
from .config import divides, positive
from .linear import Linear
from .module import Module


class MultiHeadAttention(Module):
    """Attention over [B, T, d_model] with `num_heads` heads of d_model/num_heads each.

    Fields `query`, `key`, `value`, `output` (Linear(d_model, d_model), burn's names);
    `causal` masks future keys (overridable per call). `forward(x)` is self-attention;
    `forward(q, k, v)` cross-attention; `attn_mask` (broadcast to [B, heads, Tq, Tk]) has
    torch SDPA's meaning, bool True = attend, the opposite of torch.nn.MultiheadAttention's.
    """

    def __init__(self, d_model: int, num_heads: int, bias: bool = True, causal: bool = False):
        super().__init__()
        self.d_model = positive("MultiHeadAttention d_model", d_model)
        self.num_heads = divides("MultiHeadAttention", "num_heads", num_heads, "d_model",
                                 d_model)
        self.causal = bool(causal)
        self.query, self.key, self.value, self.output = (Linear(d_model, d_model, bias)
                                                         for _ in range(4))

    def forward(self, query, key=None, value=None, causal: bool | None = None, attn_mask=None):
        key = query if key is None else key
        value = key if value is None else value
        p = (self.query, self.key, self.value, self.output)
        return F.multi_head_attention(query, key, value, self.num_heads,
                                      *(m.weight for m in p), *(m.bias for m in p),
                                      causal=self.causal if causal is None else causal,
                                      attn_mask=attn_mask)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, causal={self.causal}"
