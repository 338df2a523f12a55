"""A training step's call path once its graph and params are bound.

`TrainStep.__call__` runs each step through `BoundStep` on a backend that can run a graph
whose results it feeds back (the cpu backend's `Executable.feedback`): what the general path
looks up on every call (each param by id, into a dict of values and again to write it
back, each optimizer slot twice) is looked up once per compiled graph and param table,
and the executable binds the params and optimizer state it returned last step once,
checking only that they are still those arrays (backends/cpu/feedback.py). What a user may
change between steps is still read on every call: `entry()` checks the inputs' shapes,
flags, requires_grad and the optimizer's settings first, and each Param's value, the lr
and the optimizer's state are read afresh.
"""

from __future__ import annotations

from operator import attrgetter, is_, is_not

from .update import hyper_inputs, state_inputs

_value = attrgetter("_value")  # what Param.val() returns once the value was read


class BoundStep:
    """One compiled graph bound to one param table: the Params in the order the executable
    binds them, the buffers, Params and optimizer slots its results rebind, and the
    executable's feedback run, which takes those results back as the next step's inputs."""

    def __init__(self, entry, table: dict):
        self.table = table
        exe = entry.run
        self.params = [table[pid] for pid in exe.param_keys]
        self.nones = [None] * len(self.params)
        layout = entry.update_layout
        # buffers then params: the results right after the user's (Entry.split, write_back)
        rebound = (*entry.buffer_ids, *layout.updates)
        self.rebound = [table[pid] for pid in rebound]
        user = entry.cuts[0]
        self.cuts = user, user + len(self.rebound)
        # optimizer state: one dict of slots per param (read once per step), and each
        # slot's (dict, name) in `ember.state` order
        ids = dict.fromkeys(table[pid].id for pid, _ in layout.state)
        index = {pid: g for g, pid in enumerate(ids)}
        self.state_ids = list(index)
        self.slots = [(index[table[pid].id], name) for pid, name in layout.state]
        self.groups, self.names = [g for g, _ in self.slots], [n for _, n in self.slots]
        self.dicts: list = []
        self.rng = entry.rng_index is not None
        self.layout = layout
        # the state is the graph's last arguments (passes/optimizer.py)
        first = len(entry.graph.args) - len(layout.state)
        keys = set(exe.param_keys)
        feeds: dict[int, int | str] = {user + k: pid for k, pid in enumerate(rebound)
                                       if pid in keys}
        feeds.update({self.cuts[1] + k: first + k for k in range(len(layout.state))})
        self.run = exe.feedback(feeds)

    @classmethod
    def of(cls, step, entry, table: dict) -> BoundStep | None:
        """The bound step, or None where the general path runs: a backend without
        `feedback`, params on a device, or a result whose type is not its Param's (which
        `set_value` would convert)."""
        if step._on_device is not None or not hasattr(entry.run, "feedback"):
            return None
        user, end = entry.cuts
        ids = (*entry.buffer_ids, *entry.update_layout.updates)
        types = [v.type for v in entry.graph.return_op.operands[user:user + len(ids)]]
        if any(t.shape != table[pid].shape or t.dtype != table[pid].dtype
               for t, pid in zip(types, ids)):
            return None
        return cls(entry, table)

    def state(self, opt) -> tuple[list, list]:
        """(each param's dict of slots, each slot's value) of the optimizer's state, made
        (zeros) by `opt.slot` where missing. A slot of another shape fails the run, and
        `opt.slot` then says what is wrong (`__call__`)."""
        state, dicts = opt.state, self.dicts
        # the dicts the last step found, when the state holds exactly those, by identity
        # (ParamId hashes in Python, so looking each up again costs more)
        if not (len(state) == len(dicts) == len(self.state_ids)
                and all(map(is_, state, self.state_ids))
                and all(map(is_, state.values(), dicts))):
            dicts = self.dicts = list(map(state.get, self.state_ids))
        try:
            return dicts, list(map(dict.__getitem__, map(dicts.__getitem__, self.groups),
                                   self.names))
        except (KeyError, TypeError):  # a param's slots, or one of them, not made yet
            values = state_inputs(opt, self.layout, self.table)
            self.dicts = list(map(opt.state.get, self.state_ids))
            return self.dicts, values

    def __call__(self, step, entry, inputs: tuple):
        """One training step on `entry` (which holds this), as the general path (`execute`,
        `finish`, `write_back`) runs it."""
        if not entry.native_checks:
            step.check_inputs(entry, inputs)
        opt = step.optimizer
        dicts, state = self.state(opt) if self.slots else ((), ())
        args = [*(step.arguments(entry, inputs) if self.rng else inputs), *hyper_inputs(opt),
                *state]
        values = list(map(_value, self.params))  # val() but in C, once all are read
        if not all(map(is_not, values, self.nones)):
            values = [p.val() for p in self.params]
        try:
            outs = self.run(args, values)
        except Exception as e:
            state_inputs(opt, self.layout, self.table)  # a slot of another shape: says so
            step.explain(entry, args, step.params(self.table), e)
            raise
        user, end = self.cuts
        step.keep_loss(outs[:user])
        for p, value in zip(self.rebound, outs[user:end]):
            p._value = value  # set_value's own case: a C-contiguous array of the Param's type
        step.rng_step += 1
        for (g, name), value in zip(self.slots, outs[end:]):
            dicts[g][name] = value
        opt.step_count += 1
        return step.loss if not step.metrics else (step.loss, *step.metrics)


__all__ = ["BoundStep"]
