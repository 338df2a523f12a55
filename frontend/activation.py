"""Activations and shape layers without parameters: each calls its `nn.functional` twin."""

from __future__ import annotations

from . import functional as F
from .config import number
from .module import Module


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = number("LeakyReLU negative_slope", negative_slope, -1e30, 1e30)

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class GELU(Module):
    """Exact (`approximate="none"`, with erf) or `"tanh"`-approximated GELU."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Hardsigmoid(Module):
    def forward(self, x):
        return F.hardsigmoid(x)


class Hardswish(Module):
    def forward(self, x):
        return F.hardswish(x)


class SiLU(Module):
    def forward(self, x):
        return F.silu(x)


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class Softmax(Module):
    def __init__(self, dim: int = -1, *, axis: int | None = None):  # torch's dim, numpy's axis
        super().__init__()
        self.axis = dim if axis is None else axis

    def forward(self, x):
        return F.softmax(x, self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"


class Flatten(Module):
    """Merge dims start_dim..end_dim (default: all but the batch)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return F.flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
