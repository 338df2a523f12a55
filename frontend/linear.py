"""Linear and Sequential."""

from __future__ import annotations

import math

from . import functional
from .config import positive
from .init import KaimingUniform
from .module import Module
from .param import Param


class Linear(Module):
    """y = x @ weight + bias; weight [d_in, d_out], bias [d_out], both U(±1/sqrt(d_in))."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, init=None):
        super().__init__()
        self.d_in, self.d_out = positive("Linear d_in", d_in), positive("Linear d_out", d_out)
        init = init if init is not None else KaimingUniform(gain=1 / math.sqrt(3))
        fans = {"fan_in": d_in, "fan_out": d_out}
        self.weight = Param((d_in, d_out), init, **fans)
        self.bias = Param((d_out,), init, **fans) if bias else None

    def forward(self, x):
        return functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}, bias={self.bias is not None}"


class Sequential(Module):
    """Calls its modules in order; they are the List `layers` (paths `layers.0.weight`)."""

    def __init__(self, *modules: Module):
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential argument {i} is a {type(m).__name__}, not a Module")
        self.layers = list(modules)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
