"""Dropout: the one layer that draws random numbers."""

from __future__ import annotations

from . import functional as F
from .module import Module
from .param import Param


class Dropout(Module):
    """Zero elements with probability p (scaling the rest by 1/(1-p)) when the flag
    `training` is on and the step is a training step; p finite in [0, 1]."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = F.check_dropout_p(p)
        self.training = Param.flag(True)

    def forward(self, x):
        return F.dropout(x, self.p, bool(self.training))

    def extra_repr(self) -> str:
        return f"p={self.p}"
