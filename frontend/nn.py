"""`em.nn`: layers. Each is short: its config checks, its params (with fans), its forward."""

from __future__ import annotations

import math

from . import functional
from .init import KaimingUniform
from .module import Module
from .param import Param


def _size(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class Linear(Module):
    """y = x @ weight + bias; weight [d_in, d_out], bias [d_out], both U(±1/sqrt(d_in))."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, init=None):
        super().__init__()
        self.d_in, self.d_out = _size("Linear d_in", d_in), _size("Linear d_out", d_out)
        init = init if init is not None else KaimingUniform(gain=1 / math.sqrt(3))
        fans = {"fan_in": d_in, "fan_out": d_out}
        self.weight = Param((d_in, d_out), init, **fans)
        self.bias = Param((d_out,), init, **fans) if bias else None

    def forward(self, x):
        return functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}, bias={self.bias is not None}"


class ReLU(Module):
    def forward(self, x):
        return functional.relu(x)


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


__all__ = ["Linear", "Module", "ReLU", "Sequential", "functional"]
