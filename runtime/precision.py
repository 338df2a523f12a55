"""The precision policy, as Lightning spells it: `precision="32" | "bf16-mixed" | "16-mixed"`.

A mixed precision runs the traced forward through `autocast{dtype=...}` (passes/autocast.py)
before autodiff: matmuls, linear layers, convolutions and attention compute in bf16 or f16,
everything else (reductions, softmax, norms, losses) in f32, and the params, their gradients,
the update and the optimizer's state stay f32. `16-mixed` also scales the loss
(`LossScaler`: f16's narrow exponent would flush small gradients to zero); bf16 has f32's
exponent and needs no scaler.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..passes.manager import parse_pipeline
from .compiled import CompiledFunction

PRECISIONS = {"32": None, "bf16-mixed": "bf16", "16-mixed": "f16"}  # -> the low dtype
_F32_MAX = float(np.finfo(np.float32).max)  # the scale is fed as an f32


def check_precision(precision: str) -> str:
    """`precision`, which must be one of PRECISIONS (a usage error lists them)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, "
                         f"got {precision!r}")
    return precision


def with_precision(pipeline: list[str], precision: str, scale_loss: bool = False) -> list[str]:
    """`pipeline` under `precision`: `autocast` before its first `autodiff` or `decompose`,
    and with `scale_loss` the backward seeded with the loss scale (`autodiff{loss_scale=
    true}`); "32" leaves it as it is (so its stages and cache keys do not change)."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return pipeline
    passes = parse_pipeline(",".join(pipeline))
    specs = [str(dataclasses.replace(p, loss_scale=True))
             if scale_loss and p.name == "autodiff" else spec
             for spec, p in zip(pipeline, passes)]
    at = next(i for i, p in enumerate(passes) if p.name in ("autodiff", "decompose"))
    return [*specs[:at], f"autocast{{dtype={dtype}}}", *specs[at:]]


class Autocasting:
    """Mixed into an inference function: its pipeline under `self.precision`."""

    precision = "32"

    def pipeline(self) -> list[str]:
        return with_precision(super().pipeline(), self.precision)


class AutocastFunction(Autocasting, CompiledFunction):
    """`em.compile(..., precision="bf16-mixed" | "16-mixed")`."""

    def __init__(self, model, specs: tuple, backend: str = "cpu", linear: str = "split",
                 precision: str = "32"):
        self.precision = check_precision(precision)
        super().__init__(model, specs, backend=backend, linear=linear)


@dataclasses.dataclass
class LossScaler:
    """Dynamic loss scaling with torch.amp.GradScaler's semantics and defaults: the loss
    (the backward's seed) is multiplied by `scale`, the gradients divided by it before the
    update; a step with any inf or NaN gradient is skipped (params, optimizer state and
    step count unchanged; passes/optimizer.py) and the scale multiplied by
    `backoff_factor`; after `growth_interval` finite steps in a row, by `growth_factor`
    (where the result still fits an f32). `growth_tracker` counts those steps;
    `scale` and it are the state a checkpoint keeps."""

    scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    growth_tracker: int = 0

    def update(self, finite: bool) -> None:
        """After a step: `finite` says whether its gradients all were."""
        if not finite:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker >= self.growth_interval:
            grown = self.scale * self.growth_factor
            if math.isfinite(grown) and grown <= _F32_MAX:
                self.scale = grown
            self.growth_tracker = 0

    def state(self) -> dict:
        return {"scale": float(self.scale), "growth_tracker": int(self.growth_tracker)}

    def load_state(self, state: dict) -> None:
        self.scale, self.growth_tracker = state["scale"], state["growth_tracker"]


__all__ = ["PRECISIONS", "AutocastFunction", "LossScaler", "check_precision", "with_precision"]
