"""Embedding: rows of a table picked by integer indices."""

from __future__ import annotations

from . import functional as F
from .config import positive
from .init import Normal
from .module import Module
from .param import Param


class Embedding(Module):
    """weight [num_embeddings, d], N(0, 1) by default; forward(indices) -> indices.shape + [d]."""

    def __init__(self, num_embeddings: int, d: int, init=None):
        super().__init__()
        self.num_embeddings = positive("Embedding num_embeddings", num_embeddings)
        self.d = positive("Embedding d", d)
        self.weight = Param((num_embeddings, d), init if init is not None else Normal(0.0, 1.0),
                            fan_in=num_embeddings, fan_out=d)

    def forward(self, indices):
        return F.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"num_embeddings={self.num_embeddings}, d={self.d}"
