"""Learning-rate schedules: the lr of update number `t` (0-based), fed to the compiled step.

The lowered optimizer update takes `lr` as a graph input, so a schedule changes the lr
every step without recompiling. Pass one as an optimizer's `lr`:
`optim.Adam(lr=optim.LinearWarmup(optim.Cosine(1e-3, total_steps=1000), warmup_steps=100))`.
Each is the closed form of the PyTorch scheduler it is named after, stepped once per
update (call `scheduler.step()` after every `optimizer.step()` to compare). A schedule is
plain config (`config()` / `Schedule.from_config`), so a checkpoint stores it and the
optimizer's step count is its position.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Schedule:
    """Base: `schedule(t)` is the lr of update t (t = 0 for the first update)."""

    def __call__(self, t: int) -> float:
        raise NotImplementedError

    @property
    def base_lr(self) -> float:
        return self(0)

    def config(self) -> dict:
        out = {"kind": type(self).__name__}
        for k, v in asdict(self).items():
            out[k] = getattr(self, k).config() if isinstance(getattr(self, k), Schedule) else v
        return out

    @staticmethod
    def from_config(config: dict) -> Schedule:
        kinds = {c.__name__: c for c in (Constant, StepLR, Cosine, LinearWarmup)}
        config = dict(config)
        cls = kinds.get(config.pop("kind", None))
        if cls is None:
            raise ValueError(f"unknown schedule config {config!r}; kinds: {', '.join(kinds)}")
        if isinstance(config.get("after"), dict):
            config["after"] = Schedule.from_config(config["after"])
        return cls(**config)


def _positive(name: str, v) -> None:
    if not v > 0:
        raise ValueError(f"{name} must be positive, got {v}")


@dataclass(frozen=True)
class Constant(Schedule):
    """The same lr at every step."""

    lr: float

    def __post_init__(self):
        _positive("lr", self.lr)

    def __call__(self, t: int) -> float:
        return float(self.lr)


@dataclass(frozen=True)
class StepLR(Schedule):
    """lr * gamma ** (t // step_size), as torch.optim.lr_scheduler.StepLR (gamma 0.1)."""

    lr: float
    step_size: int
    gamma: float = 0.1

    def __post_init__(self):
        _positive("lr", self.lr)
        _positive("step_size", self.step_size)

    def __call__(self, t: int) -> float:
        return float(self.lr * self.gamma ** (t // self.step_size))


@dataclass(frozen=True)
class Cosine(Schedule):
    """min_lr + (lr - min_lr) * (1 + cos(pi * t / total_steps)) / 2: CosineAnnealingLR's closed
    form with T_max = total_steps, eta_min = min_lr. Unlike PyTorch's, which rises again
    after T_max, it stays at min_lr once t >= total_steps."""

    lr: float
    total_steps: int
    min_lr: float = 0.0

    def __post_init__(self):
        _positive("lr", self.lr)
        _positive("total_steps", self.total_steps)

    def __call__(self, t: int) -> float:
        t = min(t, self.total_steps)
        return float(self.min_lr + (self.lr - self.min_lr)
                     * (1 + math.cos(math.pi * t / self.total_steps)) / 2)


@dataclass(frozen=True)
class LinearWarmup(Schedule):
    """Warm up linearly, then follow `after` (a Schedule or a constant lr).

    For t < warmup_steps: after(0) * (start_factor + (1 - start_factor) * t / warmup_steps),
    as torch's LinearLR(start_factor, total_iters=warmup_steps); from then on
    after(t - warmup_steps), as SequentialLR([LinearLR, after], milestones=[warmup_steps]).
    """

    after: Schedule | float
    warmup_steps: int
    start_factor: float = 1 / 3

    def __post_init__(self):
        if not isinstance(self.after, Schedule):
            object.__setattr__(self, "after", Constant(float(self.after)))
        _positive("warmup_steps", self.warmup_steps)
        if not 0 < self.start_factor <= 1:
            raise ValueError(f"start_factor must be in (0, 1], got {self.start_factor}")

    def __call__(self, t: int) -> float:
        if t >= self.warmup_steps:
            return self.after(t - self.warmup_steps)
        f = self.start_factor + (1 - self.start_factor) * t / self.warmup_steps
        return float(self.after(0) * f)


def as_schedule(lr: float | Schedule) -> Schedule:
    return lr if isinstance(lr, Schedule) else Constant(float(lr))


__all__ = ["Constant", "Cosine", "LinearWarmup", "Schedule", "StepLR", "as_schedule"]
