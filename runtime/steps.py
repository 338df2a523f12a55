"""Compiled gradient functions and training steps: a loss over the model's forward, its
gradients (`GradFunction`) or forward, backward and the optimizer's update in one graph
(`TrainStep`), on `Compiled`'s cache and checks (compiled.py). A training step's call
path once bound is fast_path.py's.

A call's first `n_inputs` arguments (1 unless given) are the model's, the rest the loss
function's: `step(x, mask, y)` with `n_inputs=2` is `loss_fn(model(x, mask), y)`."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..frontend.module import Module
from ..ir import Graph
from .accumulate import Accumulator, accumulate_count, accumulation_pipeline
from .backend import to_host
from .compiled import Compiled, Entry, one_call_at_a_time
from .fast_path import BoundStep
from .held import held as held_by
from .inputs import check_arguments, finite_inputs, model_input_count
from .params import GradientsParams
from .pipeline import grad_pipeline, training_pipeline
from .precision import LossScaler, check_precision, with_precision
from .update import SettingsWatch, hyper_inputs, mark_param_groups, state_inputs, write_back


class _Training(Compiled):
    """What gradient and training steps share: a loss function, how a call's arguments
    divide between the model and the loss (`n_inputs`), input checks, metrics."""

    training = True
    scaler: LossScaler | None = None  # a training step's under "16-mixed"

    def __init__(self, model: Module, loss_fn: Callable, backend: str, linear: str,
                 detect_anomaly: bool, n_inputs: int = 1, precision: str = "32"):
        super().__init__(model, backend, linear, detect_anomaly)
        self.loss_fn = loss_fn
        self.n_inputs = model_input_count(n_inputs)
        self.precision = check_precision(precision)
        self.loss: float | None = None
        self.metrics: tuple = ()  # what loss_fn returned after the loss, from the last call

    def traced_fn(self):
        k = self.n_inputs
        return lambda *args: self.loss_fn(self.model(*args[:k]), *args[k:])

    def _trace(self, specs: tuple) -> Graph:
        graph = super()._trace(specs)
        floats = [i for i, s in enumerate(specs) if s.dtype in ("f32", "f64")]
        if floats:  # NaN/Inf inputs: checked natively where the backend can, as labels
            graph.attributes["ember.finite_args"] = floats
        return graph

    def check_inputs(self, entry: Entry, inputs: tuple) -> None:
        finite_inputs(inputs)  # batch sizes were checked by entry()
        super().check_inputs(entry, inputs)

    def check_new_inputs(self, inputs: tuple) -> None:
        check_arguments(inputs, self.n_inputs)  # before tracing, so the error is this one

    def settings(self) -> list[str]:
        shown = [f"n_inputs={self.n_inputs}"] if self.n_inputs != 1 else []
        strategy = getattr(self, "recompute", "none")  # set by each subclass
        shown += [f"precision={self.precision!r}"] if self.precision != "32" else []
        return shown + ([f"recompute={strategy!r}"] if strategy != "none" else [])

    def finish(self, entry: Entry, table: dict, outs: list) -> list:
        """Check the loss, keep loss and metrics, write buffers; returns the tail."""
        main, buffers, tail = entry.split(outs)
        self.keep_loss(main, entry)
        for pid, value in zip(entry.buffer_ids, buffers):
            self.set_param(table, pid, value)
        self.rng_step += 1
        return tail

    def keep_loss(self, main: list, entry: Entry) -> None:
        """Check the loss, before anything is written back, and keep it and the metrics.
        With loss scaling, the graph's `ember.grads_finite` result (not the user's) says
        whether the update ran, which the scaler learns, and a non-finite loss is such a
        skipped step rather than an error, as GradScaler has it."""
        at = entry.graph.attributes.get("ember.grads_finite")
        if at is not None:
            self.skipped = not bool(main[at])
            self.scaler.update(not self.skipped)
            main = [*main[:at], *main[at + 1:]]
        loss = float(main[0])
        if not math.isfinite(loss) and self.scaler is None:
            raise FloatingPointError(
                f"the loss is {loss} at step {self.rng_step}; the model's params were not "
                "updated. Rerun with detect_anomaly=True (ember train --detect-anomaly) to "
                "find the op that produced it")
        self.loss = loss
        self.metrics = tuple(float(m) if m.ndim == 0 else m
                             for m in (to_host(m) for m in main[1:])) if len(main) > 1 else ()

    def memory_report(self) -> dict:
        """Bytes by role (params, optimizer state, saved activations, kernel scratch, ...)
        of the compiled graph, from the memory planner, with the scratch each kernel needs
        where the backend sizes it (cpu: `Plan.scratch_bytes`); where the backend says what
        it allocates (cpu: `Executable.memory()`), also `real_bytes`: that plus the params,
        optimizer state and inputs as the plan counts them, and the backend's own bytes as
        `real_<role>` (`real_arena` next to the plan's `arena_bytes`). The `held_*` rows
        (runtime/held.py) measure what the step holds across all its compiled graphs, from
        the arrays themselves: `held_bytes` next to the plan's `peak_bytes`."""
        from ..passes.memory import plan_memory

        entry = self._require()
        scratch = getattr(getattr(entry.run, "plan", None), "scratch_bytes", None)
        report = plan_memory(entry.graph, scratch).report()
        memory = getattr(entry.run, "memory", None)
        if memory is not None:
            held = memory()
            report.update({f"real_{k}": v for k, v in held.items() if k != "total"})
            report["real_bytes"] = held["total"] + sum(
                report[k] for k in ("params", "optimizer_state", "inputs"))
        report.update(held_by(self))
        return report


class GradFunction(_Training):
    """`em.compile_grad(model, loss_fn)`: call(x, y) returns GradientsParams (call(x,
    mask, y) with `n_inputs=2`)."""

    kind = "grad"

    def __init__(self, model: Module, loss_fn: Callable, backend: str = "cpu",
                 linear: str = "split", recompute: str = "none",
                 memory_budget: int | None = None, detect_anomaly: bool = False,
                 n_inputs: int = 1, precision: str = "32"):
        super().__init__(model, loss_fn, backend, linear, detect_anomaly, n_inputs, precision)
        self.recompute, self.memory_budget = recompute, memory_budget

    def pipeline(self):
        return with_precision(grad_pipeline(self.linear, self.recompute, self.memory_budget),
                              self.precision)

    @one_call_at_a_time
    def __call__(self, *inputs: np.ndarray) -> GradientsParams:
        entry, table, outs = self.execute(inputs)
        grads = self.finish(entry, table, outs)
        ids = entry.graph.attributes["ember.grads"]
        return GradientsParams({table[pid].id: to_host(g) for pid, g in zip(ids, grads)})


def _check_covers(model: Module, optimizer) -> None:
    """A step updates every param that requires grad: an optimizer given only some of them
    (PyTorch's `SGD(model.head.parameters())`) would train the others silently."""
    ids = getattr(optimizer, "param_ids", None)
    if ids is None:
        return
    left = [path for path, p in model.named_parameters() if p.requires_grad and p.id not in ids]
    if left:
        raise ValueError(f"the optimizer was given {len(ids)} params, but the step updates "
                         f"every param that requires grad, and {len(left)} of them are not "
                         f"among those ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''}):"
                         f" freeze them (e.g. model.backbone.freeze()) or pass "
                         f"model.parameters()")


class TrainStep(_Training):
    """`em.compile_train_step(...)`: forward, backward and update as one compiled graph.

    Calling it returns the loss (a float), or `(loss, *metrics)` when `loss_fn` returns a
    tuple. Params, buffers and optimizer state are rebound to the arrays the step returns
    (no copies); `Param.val()` sees them, ids unchanged.

    With `accumulate=k > 1` (runtime/accumulate.py) each call is one micro-batch: calls
    1..k-1 of a cycle add their gradients to buffers, every k-th applies the update. Each
    call returns its own micro-batch's loss (and metrics), unscaled; `pending` is how many
    micro-batches the buffers hold (0 right after a call that updated).

    Under `precision="16-mixed"`, `scaler` (runtime/precision.py) scales the loss; `skipped`
    says whether the last update was skipped for inf/NaN gradients.
    """

    kind = "train_step"

    def __init__(self, model: Module, loss_fn: Callable, optimizer, backend: str = "cpu",
                 linear: str = "split", recompute: str = "none",
                 memory_budget: int | None = None, detect_anomaly: bool = False,
                 n_inputs: int = 1, accumulate: int = 1, precision: str = "32"):
        accumulate = accumulate_count(accumulate)
        super().__init__(model, loss_fn, backend, linear, detect_anomaly, n_inputs, precision)
        _check_covers(model, optimizer)
        self.scaler = LossScaler() if precision == "16-mixed" else None
        self.skipped = False  # whether the last update was skipped (`keep_loss`)
        self.optimizer = optimizer
        self.recompute, self.memory_budget = recompute, memory_budget
        self._repeating: BoundStep | None = None  # the last call's, tried first (`repeat`)
        self.accumulate = accumulate
        self.accumulator = Accumulator(accumulate) if accumulate > 1 else None

    @property
    def pending(self) -> int:
        """Micro-batches whose gradients wait for the next update (always 0 without
        `accumulate`)."""
        return 0 if self.accumulator is None else self.accumulator.pending

    def _phase(self) -> str | None:
        """Which graph the next call runs: None (the one training step), "accumulate"
        (forward, backward, gradients added to the buffers) or "update"."""
        acc = self.accumulator
        return None if acc is None else "update" if acc.updates_next else "accumulate"

    def pipeline(self):
        phase = self._phase()
        if phase is None:
            passes = training_pipeline(self.optimizer.pass_spec(), self.linear,
                                       self.recompute, self.memory_budget)
        else:
            spec = self.optimizer.pass_spec() if phase == "update" else None
            passes = accumulation_pipeline(spec, self.accumulate, self.linear, self.recompute,
                                           self.memory_budget)
        return with_precision(passes, self.precision, scale_loss=self.scaler is not None)

    def _trace(self, specs: tuple) -> Graph:
        """The training trace, with the optimizer's param groups for its pass."""
        return mark_param_groups(super()._trace(specs), self.optimizer)

    def key_extra(self) -> tuple:
        phase = self._phase()
        key = self.optimizer.update_key()
        return key if phase is None else (*key, phase)

    def watch_settings(self) -> Callable[[], bool]:
        """Whether `self.optimizer` is the same object with the same settings, read in one
        call rather than through options()' dicts (and, accumulating, the same graph)."""
        unchanged = SettingsWatch(self).unchanged
        phase = self._phase()
        if phase is None:
            return unchanged
        return lambda: self._phase() == phase and unchanged()

    def recompile_reason(self, last: Entry, specs: tuple) -> str | None:
        """Accumulating, the first compile of the update graph after the accumulate graph
        of the same inputs (or back) is no recompile: no notice."""
        phase = self._phase()
        if phase is not None and specs == last.specs \
                and ("ember.updates" in last.graph.attributes) != (phase == "update"):
            return None
        return super().recompile_reason(last, specs)

    def settings(self) -> list[str]:
        shown = [f"accumulate={self.accumulate}"] if self.accumulate != 1 else []
        return [repr(self.optimizer), *shown, *super().settings()]

    def extra_inputs(self, entry: Entry, table: dict) -> list:
        a = entry.graph.attributes
        out = [self.scaler.scale] if "ember.loss_scale" in a else []
        out += self.accumulator.inputs(entry, table) if "ember.grad_inputs" in a else []
        if "ember.updates" in a:
            out += (hyper_inputs(self.optimizer)
                    + state_inputs(self.optimizer, entry.update_layout, table))
        return out

    @one_call_at_a_time
    def __call__(self, *inputs: np.ndarray):
        bound = self._repeating
        if bound is not None and not self.detect_anomaly:
            result = bound.repeat(self, inputs)
            if result is not None:
                return result
        if self.accumulator is not None:
            return self._micro_batch(inputs)
        table = self.param_table()
        entry = self.entry(inputs, table)
        bound = entry.bound
        if bound is None or bound.table is not table:
            bound = entry.bound = BoundStep.of(self, entry, table)
        self._repeating = bound if bound is not None and bound.repeats else None
        if bound is not None and not self.detect_anomaly:
            return bound(self, entry, inputs)
        entry, table, outs = self.execute(inputs)
        tail = self.finish(entry, table, outs)
        write_back(self.optimizer, entry.update_layout, table, tail, self.set_param,
                   count=not self.skipped)
        return self.loss if not self.metrics else (self.loss, *self.metrics)

    def _micro_batch(self, inputs: tuple):
        """One call of an accumulating step, on the general path: the accumulate graph,
        whose new buffers are kept, or (every k-th call) the update graph, written back as
        a training step's. A non-finite loss raises before anything changes."""
        acc = self.accumulator
        update = acc.updates_next
        entry, table, outs = self.execute(inputs)
        tail = self.finish(entry, table, outs)
        if update:
            write_back(self.optimizer, entry.update_layout, table, tail, self.set_param,
                       count=not self.skipped)
            acc.reset()
        else:
            acc.keep(entry, table, tail)
        return self.loss if not self.metrics else (self.loss, *self.metrics)

    def accumulated(self) -> tuple[int, dict]:
        """(micro-batches pending, their summed gradients by ParamId): what a checkpoint
        saved mid-accumulation keeps."""
        acc = self.accumulator
        return (0, {}) if acc is None else (acc.pending, {pid: to_host(g)
                                                          for pid, g in acc.grads.items()})

    def restore_accumulated(self, pending: int, grads: dict) -> None:
        """Set what `accumulated` returned (a checkpoint's; 0 and {}: nothing pending)."""
        if self.accumulator is not None:
            self.accumulator.restore(pending, grads)
        elif pending:
            raise ValueError(f"{pending} accumulated micro-batch(es), but this step does not "
                             "accumulate")

    def save_checkpoint(self, path: str, extra: dict | None = None) -> str:
        """Params, optimizer state, step and RNG counters, schedule and the model's flags,
        as safetensors written atomically; `extra` (JSON) rides along (the data position).
        Saved mid-accumulation (`pending > 0`), it also holds the gradient buffers and the
        count, and resumes the cycle where it was."""
        from .checkpoint import save

        return save(self, path, extra)

    def load_checkpoint(self, path: str, parse_extra: Callable | None = None):
        """Restore what `save_checkpoint` wrote; returns its `extra` (through `parse_extra`,
        which may refuse it). Nothing changes when the file is damaged or belongs to another
        model (the error lists the paths)."""
        from .checkpoint import load

        return load(self, path, parse_extra)


__all__ = ["GradFunction", "TrainStep"]
