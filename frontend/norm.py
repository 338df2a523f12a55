"""Normalization layers: LayerNorm, GroupNorm, RMSNorm, BatchNorm1d/2d/3d.

BatchNorm keeps its running statistics as buffers (`visit_buffer`, never trained) and its
mode as the flag `training`: batch statistics are used, and the running ones updated,
only when the flag is on and the trace is a training trace.
"""

from __future__ import annotations

import math

from . import context
from . import functional as F
from .config import divides, number, positive
from .init import Ones, Zeros
from .module import Module
from .param import Param


def _shape(layer: str, d) -> tuple[int, ...]:
    shape = (d,) if isinstance(d, int) and not isinstance(d, bool) else tuple(d)
    if not shape:
        raise ValueError(f"{layer} needs a normalized shape, got {d!r}")
    for n in shape:
        positive(f"{layer} size", n)
    return shape


def _eps(layer: str, eps) -> float:
    eps = number(f"{layer} eps", eps, 0.0, math.inf)
    if eps <= 0:
        raise ValueError(f"{layer} eps must be positive, got {eps!r}")
    return eps


class LayerNorm(Module):
    """Normalize over the trailing `d` (int or shape), then * gamma + beta."""

    def __init__(self, d, eps: float = 1e-5):
        super().__init__()
        self.shape, self.eps = _shape("LayerNorm", d), _eps("LayerNorm", eps)
        self.gamma = Param(self.shape, Ones())
        self.beta = Param(self.shape, Zeros())

    def forward(self, x):
        return F.layer_norm(x, self.shape, self.gamma, self.beta, self.eps)

    def extra_repr(self) -> str:
        return f"shape={list(self.shape)}, eps={self.eps}"


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) over the trailing `d`, then * gamma."""

    def __init__(self, d, eps: float = 1e-5):
        super().__init__()
        self.shape, self.eps = _shape("RMSNorm", d), _eps("RMSNorm", eps)
        self.gamma = Param(self.shape, Ones())

    def forward(self, x):
        return F.rms_norm(x, self.shape, self.gamma, self.eps)

    def extra_repr(self) -> str:
        return f"shape={list(self.shape)}, eps={self.eps}"


class GroupNorm(Module):
    """Normalize [N, C, ...] within groups of channels, then per-channel gamma, beta."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True):
        super().__init__()
        positive("GroupNorm num_groups", num_groups)  # reported first when both are bad
        self.num_channels = positive("GroupNorm num_channels", num_channels)
        self.num_groups = divides("GroupNorm", "num_groups", num_groups, "num_channels",
                                  num_channels)
        self.eps = _eps("GroupNorm", eps)
        self.gamma = Param((num_channels,), Ones()) if affine else None
        self.beta = Param((num_channels,), Zeros()) if affine else None

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.gamma, self.beta, self.eps)

    def extra_repr(self) -> str:
        return (f"num_groups={self.num_groups}, num_channels={self.num_channels}, "
                f"eps={self.eps}, affine={self.gamma is not None}")


class BatchNorm(Module):
    """The shared body of BatchNorm1d/2d/3d (which input ranks they take), torch's
    arguments: `affine=False` has no gamma and beta, `track_running_stats=False` no running
    statistics (the batch's are used in training and inference alike).
    `sync=True`: normalize with the statistics of the global batch of a data-parallel run
    (torch's SyncBatchNorm; see F.batch_norm)."""

    ranks: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, *, sync: bool = False):
        super().__init__()
        name = type(self).__name__
        self.num_features = positive(f"{name} num_features", num_features)
        if momentum is None:
            raise ValueError(f"{name} momentum=None (torch's cumulative average) is not "
                             "supported: give a number in [0, 1]")
        self.eps, self.momentum = _eps(name, eps), number(f"{name} momentum", momentum, 0, 1)
        self.sync = bool(sync)
        c = (num_features,)
        self.gamma = Param(c, Ones()) if affine else None
        self.beta = Param(c, Zeros()) if affine else None
        self.running_mean = Param(c, Zeros(), kind="buffer") if track_running_stats else None
        self.running_var = Param(c, Ones(), kind="buffer") if track_running_stats else None
        self.training = Param.flag(True)

    def forward(self, x):
        t = context.current()
        x = t.lift(x)
        if x.ndim not in self.ranks:
            want = " or ".join(("(N, C)", "(N, C, L)", "(N, C, H, W)", "(N, C, D, H, W)")[r - 2]
                               for r in self.ranks)
            raise t.error(f"{type(self).__name__} input must be {want}, got {list(x.shape)}")
        return F.batch_norm(x, self.running_mean, self.running_var, self.gamma, self.beta,
                            bool(self.training) or self.running_mean is None, self.momentum,
                            self.eps, self.sync)

    def extra_repr(self) -> str:
        return (f"num_features={self.num_features}, eps={self.eps}, momentum={self.momentum}"
                + (", affine=False" if self.gamma is None else "")
                + (", track_running_stats=False" if self.running_mean is None else "")
                + (", sync=True" if self.sync else ""))


class BatchNorm1d(BatchNorm):
    """Batch normalization of (N, C) or (N, C, L) over all but the channel axis."""

    ranks = (2, 3)


class BatchNorm2d(BatchNorm):
    """Batch normalization of (N, C, H, W) over all but the channel axis."""

    ranks = (4,)


class BatchNorm3d(BatchNorm):
    """Batch normalization of (N, C, D, H, W) over all but the channel axis."""

    ranks = (5,)
