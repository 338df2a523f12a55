"""The compile entry points of the public API (`em.compile`, `em.compile_grad`, ...)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

from ..frontend.module import Module
from ..passes.manager import PASSES
from . import distributed
from .accumulate import accumulate_count
from .compiled import CompiledFunction
from .distributed import Communicator
from .dynamic import DynamicDims, DynamicFunction, DynamicGradFunction, DynamicTrainStep
from .optim import Optimizer
from .precision import AutocastFunction, check_precision
from .steps import GradFunction, TrainStep

# what a `recompute{strategy=...}` pass may offer, in order; only those it has are listed
_KNOWN_STRATEGIES = ("none", "all", "balanced", "min-cut")


def recompute_strategies() -> tuple[str, ...]:
    """The recompute (activation checkpointing) strategies this build supports ("none"
    always)."""
    cls = PASSES.get("recompute")
    if cls is None:
        return ("none",)
    offered = getattr(cls, "STRATEGIES", None) or getattr(cls, "strategies", None)
    if offered is None:
        return ("none",)
    return tuple(s for s in _KNOWN_STRATEGIES if s == "none" or s in offered)


def checkpoint_strategies() -> tuple[str, ...]:
    """Deprecated old name of `recompute_strategies`."""
    warnings.warn("checkpoint_strategies() is deprecated: use recompute_strategies()",
                  DeprecationWarning, stacklevel=2)
    return recompute_strategies()


def compile(model: Module, *specs, backend: str = "cpu",  # noqa: A001  (em.compile)
            linear: str = "split", dynamic_dims: dict | None = None,
            buckets: tuple[int, ...] | None = None, precision: str = "32") -> CompiledFunction:
    """The model's forward for inputs like `specs` (TensorSpecs or example arrays).

    Traced for inference: dropout is off and BatchNorm uses its running statistics,
    whatever the model's flags say.

    Symbolic dimensions: a name in a spec's shape, `em.TensorSpec((16, "T"), "i64")`, or
    `dynamic_dims={input index: {axis: "T"}}`. Each call pads them to a bucket (powers of
    two from 8, or the sizes `buckets` lists) and masks the padding, so the results equal
    an exact-shape compile's while every length in a bucket shares one graph (compiled on
    first call; runtime/dynamic.py). Inputs that share a name must agree on its size.

    `precision`: "32", or "bf16-mixed" / "16-mixed": matmuls, linear layers, convolutions
    and attention run in bf16 / f16, the rest in f32 (runtime/precision.py); the outputs
    are f32 as in "32".
    """
    check_precision(precision)
    dynamic = DynamicDims.of(specs, dynamic_dims, buckets)
    if dynamic is not None:
        return DynamicFunction(model, dynamic, backend=backend, linear=linear,
                               precision=precision)
    if precision != "32":
        return AutocastFunction(model, specs, backend=backend, linear=linear,
                                precision=precision)
    return CompiledFunction(model, specs, backend=backend, linear=linear)


def compile_grad(model: Module, loss_fn: Callable, backend: str = "cpu",
                 recompute: str = "none", memory_budget: int | None = None,
                 linear: str = "split", detect_anomaly: bool = False,
                 dynamic_dims: dict | None = None,
                 buckets: tuple[int, ...] | None = None, n_inputs: int = 1,
                 checkpoint: str | None = None, precision: str = "32") -> GradFunction:
    """`fn(x, y)` returning em.GradientsParams of `loss_fn(model(x), y)`; compiles on first
    call. `n_inputs`, `recompute` and `memory_budget` as for `compile_train_step` (the
    budget is the planned peak of the gradient graph): `fn(x, mask, y)` with `n_inputs=2`
    differentiates `loss_fn(model(x, mask), y)`; `dynamic_dims` and `buckets` as for
    `compile` (indices count every argument: x, y, ...). `precision` as for
    `compile_train_step`, but "16-mixed" scales no loss: the gradients are those of the
    loss itself, f32 as the params are."""
    options = _training_options(backend, linear, _renamed(recompute, checkpoint),
                                memory_budget, detect_anomaly, n_inputs, precision)
    dynamic = DynamicDims.of((), dynamic_dims, buckets)
    if dynamic is not None:
        return DynamicGradFunction(model, loss_fn, dynamic, **options)
    return GradFunction(model, loss_fn, **options)


def compile_train_step(model: Module, loss_fn: Callable, optimizer: Optimizer,
                       backend: str = "cpu", recompute: str = "none",
                       memory_budget: int | None = None, linear: str = "split",
                       detect_anomaly: bool = False,
                       data_parallel: bool | Communicator = False,
                       dynamic_dims: dict | None = None,
                       buckets: tuple[int, ...] | None = None,
                       n_inputs: int = 1, accumulate: int = 1,
                       shard_optimizer: bool = False,
                       checkpoint: str | None = None, precision: str = "32") -> TrainStep:
    """`step(x, y)`: forward, backward and update in one compiled graph; returns the loss.

    `n_inputs`: how many leading arguments of each call go to the model; the rest go to
    the loss function: `step(x, mask, y)` with `n_inputs=2` trains `loss_fn(model(x, mask),
    y)`. Every argument with a first axis shares the batch size (the error names the
    argument: its index and role, model input k or loss argument k).

    `recompute`: which activations the backward recomputes instead of keeping (activation
    checkpointing, as torch.utils.checkpoint; `checkpoint=` is its deprecated old name; see
    `recompute_strategies()`: "none", "all", "balanced", "min-cut"); `memory_budget`
    (bytes, the planned peak of the whole step) makes "min-cut" search for the cheapest
    recomputation that fits, and other strategies fail at compile time when over it; it
    implies "min-cut" when `recompute` is "none".
    `detect_anomaly`: check every result for NaN/Inf and, if found, name the first op that
    produced it (slow: for debugging).
    `data_parallel`: True (join the process group the launcher set up, see
    `em.distributed.init`) or a Communicator: each rank passes its shard of the global
    batch and the gradients are averaged across ranks before the update (runtime/
    data_parallel.py), so the run equals single-process training on the global batch.
    `shard_optimizer` (with `data_parallel`): ZeRO-1, each rank keeps the optimizer state
    of 1/N of the params (dealt whole, largest first) and updates those; gradients are
    reduce-scattered and the new params all-gathered (runtime/zero.py). The results equal
    unsharded data-parallel training; checkpoints hold the whole state and load into any
    world size.
    `dynamic_dims`, `buckets`: symbolic dimensions of the call's arguments (model inputs
    and loss arguments alike, by position) as for `compile` (`{0: {1: "T"}, 1: {1: "T"}}`:
    tokens and targets of any length T; `{0: {1: "T"}, 1: {1: "T"}, 2: {1: "T"}}` adds an
    attention mask with `n_inputs=2`); the loss, the gradients and so the updated params
    equal those of an exact-shape step.
    `accumulate`: gradient accumulation over k micro-batches (runtime/accumulate.py). Each
    call `step(x, y)` takes one micro-batch and returns its own loss (unscaled); the
    gradients of each micro-batch, weighted 1/k, are summed into buffers and the optimizer
    updates on every k-th call, so with a mean-reduced loss `accumulate=k` over k
    micro-batches of one size equals one step on their concatenation (up to the order of
    f32 sums). Micro-batches of different sizes (`dynamic_dims`) are weighted 1/k each,
    as PyTorch's `(loss / k).backward()` loop, not by size. `optimizer.step_count`, hence
    the lr schedule, advances once per update; `step.pending` counts the micro-batches
    waiting for it (0 after an updating call). With `data_parallel`, the gradients are
    reduced across ranks once per update; a micro-batch call that does not update returns
    its rank's own loss, an updating call the ranks' mean, as without accumulation.
    `save_checkpoint` mid-accumulation keeps the buffers, and resuming continues the cycle.
    Batch-statistic layers (BatchNorm) see each micro-batch alone, as in PyTorch.
    `precision` (Lightning's names; runtime/precision.py): "32"; "bf16-mixed" (matmuls,
    linear layers, convolutions and attention in bf16, reductions, softmax, norms, losses
    and the update in f32; params and optimizer state stay f32); "16-mixed" (the same in
    f16, with dynamic loss scaling as torch.amp.GradScaler: `step.scaler`; a step with
    inf/NaN gradients is skipped, `step.skipped`, and the scale halved; the scaler's state
    is saved in checkpoints).
    """
    accumulate = accumulate_count(accumulate)  # a usage error before anything is built
    if shard_optimizer and data_parallel is False:
        raise ValueError("shard_optimizer shards the optimizer state across data-parallel "
                         "ranks: pass data_parallel=True (or a communicator) with it")
    options = _training_options(backend, linear, _renamed(recompute, checkpoint),
                                memory_budget, detect_anomaly, n_inputs, precision)
    options["accumulate"] = accumulate
    dynamic = DynamicDims.of((), dynamic_dims, buckets)
    if dynamic is not None:
        if data_parallel is not False:
            raise ValueError("dynamic_dims with data_parallel is not supported: pad the "
                             "shards to one length")
        return DynamicTrainStep(model, loss_fn, optimizer, dynamic, **options)
    if data_parallel is False:
        return TrainStep(model, loss_fn, optimizer, **options)
    from .data_parallel import DataParallelStep

    if data_parallel is True:
        data_parallel = distributed.init()
    if not isinstance(data_parallel, Communicator):
        raise TypeError(f"data_parallel must be True, False or a Communicator "
                        f"(em.distributed.init()), got {data_parallel!r}")
    return DataParallelStep(model, loss_fn, optimizer, data_parallel, shard_optimizer,
                            **options)


def _renamed(recompute: str, checkpoint: str | None) -> str:
    """`recompute=`, or the strategy given by its deprecated old name `checkpoint=` (which
    now means saving training state only)."""
    if checkpoint is None:
        return recompute
    warnings.warn("checkpoint= is deprecated: the strategy is now recompute= (checkpoint "
                  "means saving training state)", DeprecationWarning, stacklevel=3)
    return checkpoint


def _training_options(backend: str, linear: str, recompute: str, memory_budget: int | None,
                      detect_anomaly: bool, n_inputs: int, precision: str) -> dict:
    """The options a gradient function or training step is built with, the recompute
    strategy and the precision checked (steps.py checks `n_inputs`: a bad one fails here
    too, not at the first call)."""
    return dict(backend=backend, linear=linear, recompute=_strategy(recompute, memory_budget),
                memory_budget=memory_budget, detect_anomaly=detect_anomaly, n_inputs=n_inputs,
                precision=check_precision(precision))


def _strategy(recompute: str, memory_budget: int | None) -> str:
    """The recompute strategy to run: checked, and "min-cut" when only a budget is given."""
    available = recompute_strategies()
    if memory_budget is not None:
        if memory_budget <= 0:
            raise ValueError(f"memory_budget must be a positive number of bytes, "
                             f"got {memory_budget}")
        recompute = "min-cut" if recompute == "none" else recompute
    if recompute not in available:
        raise ValueError(f"recompute strategy {recompute!r} is not available in this version; "
                         f"choose one of {', '.join(available)}")
    return recompute
