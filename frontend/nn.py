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
from .conv import Conv1d, Conv2d, Conv3d, ConvTranspose2d, ConvTranspose3d
from .dropout import Dropout
from .embedding import Embedding
from .linear import Linear, Sequential
from .module import Module
from .norm import BatchNorm1d, BatchNorm2d, BatchNorm3d, GroupNorm, LayerNorm, RMSNorm
from .param import Parameter
from .pool import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
)
from .resize import Upsample

__all__ = ["AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d",
           "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
           "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Conv1d", "Conv2d", "Conv3d",
           "ConvTranspose2d", "ConvTranspose3d", "Dropout", "Embedding", "Flatten", "GELU",
           "GroupNorm", "Hardsigmoid", "Hardswish", "LayerNorm", "LeakyReLU", "Linear",
           "MaxPool1d", "MaxPool2d", "MaxPool3d", "Module", "ModuleDict", "ModuleList",
           "MultiHeadAttention", "Parameter", "RMSNorm", "ReLU", "SiLU", "Sequential", "Sigmoid",
           "Softmax", "Tanh", "Upsample", "functional"]
