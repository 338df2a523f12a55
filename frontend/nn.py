"""`em.nn`: layers (one small file per family) and `nn.functional`.

Each layer is short: its config checks (a bad value fails at construction, naming it),
its params (with fans for the initializer), its forward (one `nn.functional` call).
"""

from __future__ import annotations

from . import functional
from .activation import (
    GELU,
    Flatten,
    Hardsigmoid,
    Hardswish,
    LeakyReLU,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from .attention import MultiHeadAttention
from .containers import ModuleDict, ModuleList
from .conv import Conv1d, Conv2d, ConvTranspose2d
from .dropout import Dropout
from .embedding import Embedding
from .linear import Linear, Sequential
from .module import Module
from .norm import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm, RMSNorm
from .param import Parameter
from .pool import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from .resize import Upsample

__all__ = ["AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Conv1d", "Conv2d",
           "ConvTranspose2d", "Dropout", "Embedding", "Flatten", "GELU", "GroupNorm", "Hardsigmoid",
           "Hardswish", "LayerNorm", "LeakyReLU", "Linear", "MaxPool2d", "Module", "ModuleDict",
           "ModuleList", "MultiHeadAttention", "Parameter", "RMSNorm", "ReLU", "SiLU", "Sequential",
           "Sigmoid", "Softmax", "Tanh", "Upsample", "functional"]
