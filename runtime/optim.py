"""Optimizers: hyper-parameters and state keyed by ParamId; the update itself is IR.

The update rule is lowered into the training graph by the `optimizer` pass, so a
compiled step runs forward, backward and update in one call. `opt.step(model, grads)`
runs the same lowered rule for hand-written loops.

State lives in `opt.state[param.id]` (a dict of slot name -> array), so a Param replaced
through `Param.map` (same id) keeps its moments and one made by `Param.from_array` (new
id) starts fresh, as in burn. `lr` is a float or a schedule (`optim.Cosine`, ...), read
at every step; `clip_norm > 0` scales the gradients so that their global L2 norm is at
most `clip_norm`, inside the compiled step (PyTorch's `clip_grad_norm_`).

Defaults follow PyTorch, since that is what users compare against: Adam eps 1e-8, AdamW
weight decay 1e-2, clipping by the norm of all gradients together. burn's differ: its
Adam/AdamW epsilon is 1e-5, and its `GradientClipping::Norm` clips each tensor by its own
norm.
"""

from __future__ import annotations

import math

import numpy as np

from ..frontend.param import Param, ParamId
from ..ir import numpy_dtype
from .schedules import Constant, Cosine, LinearWarmup, Schedule, StepLR, as_schedule


def setting(name: str, value, positive: bool = False, below_one: bool = False) -> float:
    """`value` as a float, refused (ValueError) unless finite and >= 0 (> 0 where
    `positive`, < 1 where `below_one`): an inf or NaN setting would train on NaN silently."""
    v = float(value)
    if not (math.isfinite(v) and (v > 0 if positive else v >= 0) and (v < 1 or not below_one)):
        bounds = "> 0" if positive else ("in [0, 1)" if below_one else ">= 0")
        raise ValueError(f"{name} must be a finite number {bounds}, got {value!r}")
    return v


def _schedule(lr: float | Schedule) -> Schedule:
    return lr if isinstance(lr, Schedule) else as_schedule(setting("learning rate", lr, True))


_UNSET = object()  # an lr not given (PyTorch's spelling puts the params first)


def _params_and_lr(params, lr, default: float):
    """(the ParamIds PyTorch's first argument names, or None; the lr). `SGD(0.1)` (ember's
    spelling, lr first) and `SGD(model.parameters(), lr=0.1)` (PyTorch's) both work; param
    groups work when they add no settings of their own."""
    if params is None or isinstance(params, (int, float, Schedule)):
        if params is not None and lr is not _UNSET:
            raise TypeError("give the learning rate once: SGD(lr=0.1) or "
                            "SGD(model.parameters(), lr=0.1)")
        lr = params if params is not None else lr
        return None, default if lr is _UNSET else lr
    items = list(params)
    if items and all(isinstance(g, dict) for g in items):
        own = sorted({k for g in items for k in g} - {"params"})
        if own:
            raise NotImplementedError(f"param groups with settings of their own ({', '.join(own)})"
                                      " are not supported: one optimizer's settings apply to "
                                      "every param")
        items = [p for g in items for p in g["params"]]
    if not all(isinstance(p, Param) for p in items):
        raise TypeError("an optimizer's first argument is the learning rate or the params "
                        "(model.parameters()), got "
                        + ", ".join(sorted({type(p).__name__ for p in items})))
    return frozenset(p.id for p in items), default if lr is _UNSET else lr


class Optimizer:
    kind = ""

    def __init__(self, lr: float | Schedule, weight_decay: float = 0.0, clip_norm: float = 0.0,
                 params: frozenset | None = None):
        self.param_ids = params  # the params PyTorch's spelling named (None: all)
        self.schedule = _schedule(lr)
        self.weight_decay = setting("weight_decay", weight_decay)
        self.clip_norm = setting("clip_norm (0: no clipping)", clip_norm)
        self.state: dict[ParamId, dict[str, np.ndarray]] = {}
        self.step_count = 0  # updates applied so far: the schedule's position

    @property
    def lr(self) -> float:
        """The lr of the next update (the schedule at `step_count`)."""
        return self.schedule(self.step_count)

    @lr.setter
    def lr(self, value: float | Schedule) -> None:
        self.schedule = _schedule(value)

    def options(self) -> dict:
        clip = {"clip_norm": self.clip_norm} if self.clip_norm else {}
        return {"weight_decay": self.weight_decay, **clip}

    def config(self) -> dict:
        """What recreates this optimizer (without its state): kind, options, schedule."""
        return {"kind": self.kind, "options": self.options(), "schedule": self.schedule.config()}

    def pass_spec(self) -> str:
        """This optimizer as a pipeline entry: `optimizer{kind=adam beta1=0.9 ...}`."""
        opts = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                        for k, v in {"kind": self.kind, **self.options()}.items())
        return f"optimizer{{{opts}}}"

    def slot(self, pid: ParamId, name: str, like: Param) -> np.ndarray:
        """The state tensor `name` of a param, zeros of its shape and dtype on first use
        (read from the Param, not its value, which on a device would be copied to the
        host)."""
        slots = self.state.setdefault(pid, {})
        value = slots.get(name)
        if value is None:
            value = slots[name] = np.zeros(like.shape, numpy_dtype(like.dtype))
        if value.shape != like.shape:
            raise ValueError(f"optimizer state {name!r} of param {pid} has shape "
                             f"{list(value.shape)} but the param now has {list(like.shape)}; "
                             f"drop it with `del opt.state[param.id]` to start fresh")
        return value

    def step(self, model, grads) -> None:
        """Apply `grads` (em.GradientsParams) to `model`'s params in place."""
        from .update import apply_update

        apply_update(self, model, grads)

    def __repr__(self) -> str:
        lr = self.schedule.lr if isinstance(self.schedule, Constant) else self.schedule
        opts = ", ".join(f"{k}={v}" for k, v in {"lr": lr, **self.options()}.items())
        return f"{type(self).__name__}({opts})"


class SGD(Optimizer):
    kind = "sgd"

    def __init__(self, params=None, lr: float | Schedule = _UNSET, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, clip_norm: float = 0.0):
        params, lr = _params_and_lr(params, lr, 1e-2)
        super().__init__(lr, weight_decay, clip_norm, params)
        if nesterov and momentum <= 0:
            raise ValueError("nesterov momentum needs momentum > 0")
        self.momentum, self.nesterov = setting("momentum", momentum), bool(nesterov)

    def options(self) -> dict:
        return {"momentum": self.momentum, "nesterov": self.nesterov, **super().options()}


class Adam(Optimizer):
    kind = "adam"

    def __init__(self, params=None, lr: float | Schedule = _UNSET,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, clip_norm: float = 0.0):
        params, lr = _params_and_lr(params, lr, 1e-3)
        super().__init__(lr, weight_decay, clip_norm, params)
        self.beta1, self.beta2 = (setting(f"beta{i}", b, below_one=True)
                                  for i, b in enumerate(betas, 1))
        self.eps = setting("eps", eps)

    def options(self) -> dict:
        return {"beta1": self.beta1, "beta2": self.beta2, "eps": self.eps, **super().options()}


class AdamW(Adam):
    kind = "adamw"

    def __init__(self, params=None, lr: float | Schedule = _UNSET,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, clip_norm: float = 0.0):
        super().__init__(params, lr, betas, eps, weight_decay, clip_norm)


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def from_config(config: dict) -> Optimizer:
    """The optimizer `opt.config()` describes (fresh state, step 0)."""
    cls = OPTIMIZERS.get(config.get("kind"))
    if cls is None:
        raise ValueError(f"unknown optimizer kind {config.get('kind')!r}")
    opts = dict(config.get("options", {}))
    if "beta1" in opts:
        opts["betas"] = (opts.pop("beta1"), opts.pop("beta2"))
    return cls(lr=Schedule.from_config(config["schedule"]), **opts)


__all__ = ["SGD", "Adam", "AdamW", "Constant", "Cosine", "LinearWarmup", "Optimizer", "Schedule",
           "StepLR", "from_config"]
