"""The compile entry points of the public API (`em.compile`, `em.compile_grad`, ...)."""

from __future__ import annotations

from collections.abc import Callable

from ..frontend.module import Module
from .compiled import CompiledFunction, GradFunction, TrainStep
from .optim import Optimizer

CHECKPOINT_STRATEGIES = ("none",)


def compile(model: Module, *specs, backend: str = "cpu",  # noqa: A001  (em.compile)
            linear: str = "split") -> CompiledFunction:
    """The model's forward for inputs like `specs` (TensorSpecs or example arrays)."""
    return CompiledFunction(model, specs, backend=backend, linear=linear)


def compile_grad(model: Module, loss_fn: Callable, backend: str = "cpu",
                 linear: str = "split") -> GradFunction:
    """`fn(x, y)` returning em.GradientsParams of `loss_fn(model(x), y)`; compiles on first call."""
    return GradFunction(model, loss_fn, backend=backend, linear=linear)


def compile_train_step(model: Module, loss_fn: Callable, optimizer: Optimizer,
                       backend: str = "cpu", checkpoint: str = "none",
                       linear: str = "split") -> TrainStep:
    """`step(x, y)`: forward, backward and update in one compiled graph; returns the loss."""
    if checkpoint not in CHECKPOINT_STRATEGIES:
        raise ValueError(f"checkpoint strategy {checkpoint!r} is not available in this version; "
                         f"choose one of {', '.join(CHECKPOINT_STRATEGIES)}")
    return TrainStep(model, loss_fn, optimizer, backend=backend, linear=linear)
