"""Optimizers: hyper-parameters and state keyed by ParamId; the update itself is IR.

The update rule is lowered into the training graph by the `optimizer` pass, so a
compiled step runs forward, backward and update in one call. `opt.step(model, grads)`
runs the same lowered rule for hand-written loops. Defaults follow PyTorch (Adam eps
1e-8, AdamW weight decay 1e-2); burn's differ (eps 1e-5).
"""

from __future__ import annotations

import numpy as np

from ..frontend.param import ParamId


class Optimizer:
    kind = ""

    def __init__(self, lr: float, weight_decay: float = 0.0):
        if not lr > 0:
            raise ValueError(f"learning rate must be positive, got {lr}")
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.state: dict[ParamId, dict[str, np.ndarray]] = {}
        self.step_count = 0

    def options(self) -> dict:
        return {"weight_decay": self.weight_decay}

    def pass_spec(self) -> str:
        """This optimizer as a pipeline entry: `optimizer{kind=adam beta1=0.9 ...}`."""
        opts = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                        for k, v in {"kind": self.kind, **self.options()}.items())
        return f"optimizer{{{opts}}}"

    def slot(self, pid: ParamId, name: str, like: np.ndarray) -> np.ndarray:
        """The state tensor `name` of a param, zeros on first use."""
        return self.state.setdefault(pid, {}).setdefault(name, np.zeros_like(like))

    def step(self, model, grads) -> None:
        """Apply `grads` (em.GradientsParams) to `model`'s params in place."""
        from .update import apply_update

        apply_update(self, model, grads)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in {"lr": self.lr, **self.options()}.items())
        return f"{type(self).__name__}({opts})"


class SGD(Optimizer):
    kind = "sgd"

    def __init__(self, lr: float = 1e-2, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False):
        super().__init__(lr, weight_decay)
        if nesterov and momentum <= 0:
            raise ValueError("nesterov momentum needs momentum > 0")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def options(self) -> dict:
        return {"momentum": self.momentum, "nesterov": self.nesterov, **super().options()}


class Adam(Optimizer):
    kind = "adam"

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(lr, weight_decay)
        self.beta1, self.beta2 = map(float, betas)
        self.eps = float(eps)

    def options(self) -> dict:
        return {"beta1": self.beta1, "beta2": self.beta2, "eps": self.eps, **super().options()}


class AdamW(Adam):
    kind = "adamw"

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(lr, betas, eps, weight_decay)
