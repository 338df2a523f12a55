"""A training step's call path once its graph and params are bound.

`TrainStep.__call__` runs each step through `BoundStep` on a backend that takes the params'
values as a list (the cpu backend's `run_values`): what the general path looks up on every
call (each param by id, into a dict of values and again to write it back) is looked up once
per compiled graph and param table. What a user may change between steps is still read on
every call: `entry()` checks the inputs' shapes, flags, requires_grad and the optimizer's
settings first, and each Param's value, the lr and the optimizer's state are read afresh.
"""

from __future__ import annotations


class BoundStep:
    """One compiled graph bound to one param table: the Params in the order the executable
    binds them, and the buffers, Params and optimizer slots its results rebind."""

    def __init__(self, entry, table: dict):
        self.table = table
        self.run = entry.run.run_values
        self.params = [table[pid] for pid in entry.run.param_keys]
        layout = entry.update_layout
        # buffers then params: the results right after the user's (Entry.split, write_back)
        self.rebound = [table[pid] for pid in (*entry.buffer_ids, *layout.updates)]
        self.state = [(table[pid].id, name) for pid, name in layout.state]
        user = entry.cuts[0]
        self.cuts = user, user + len(self.rebound)

    @classmethod
    def of(cls, step, entry, table: dict) -> BoundStep | None:
        """The bound step, or None where the general path runs: a backend without
        `run_values`, params on a device, or a result whose type is not its Param's (which
        `set_value` would convert)."""
        if step._on_device is not None or not hasattr(entry.run, "run_values"):
            return None
        bound = cls(entry, table)
        user, end = bound.cuts
        types = [v.type for v in entry.graph.return_op.operands[user:end]]
        if any(t.shape != p.shape or t.dtype != p.dtype for t, p in zip(types, bound.rebound)):
            return None
        return bound

    def __call__(self, step, entry, inputs: tuple):
        """One training step on `entry` (which holds this), as the general path (`execute`,
        `finish`, `write_back`) runs it."""
        if not entry.native_checks:
            step.check_inputs(entry, inputs)
        args = step.arguments(entry, inputs) + step.extra_inputs(entry, self.table)
        try:
            outs = self.run(args, [p.val() for p in self.params])
        except Exception as e:
            step.explain(entry, args, step.params(self.table), e)
            raise
        user, end = self.cuts
        step.keep_loss(outs[:user])
        for p, value in zip(self.rebound, outs[user:end]):
            p._value = value  # set_value's own case: a C-contiguous array of the Param's type
        step.rng_step += 1
        opt = step.optimizer
        if self.state:
            slots = opt.state
            for (pid, name), value in zip(self.state, outs[end:]):
                slots[pid][name] = value
        opt.step_count += 1
        return step.loss if not step.metrics else (step.loss, *step.metrics)


__all__ = ["BoundStep"]
