"""A training step's call path once its graph and params are bound.

`TrainStep.__call__` runs each step through `BoundStep` on a backend that can run a graph
whose results it feeds back (the cpu backend's `Executable.feedback`): what the general path
looks up on every call (each param by id, into a dict of values and again to write it
back, each optimizer slot twice) is looked up once per compiled graph and param table,
and the executable binds the params and optimizer state it returned last step once: a
step checks that each fed Param and slot still holds the array of the feedback run's turn
(`turn.fed`) and calls it bound, else runs its general call (backends/cpu/call/bound.py);
the loss is a scratch result, read into a float at once. What a user may
change between steps is still read on every call: `entry()` checks the inputs' shapes,
flags, requires_grad and the optimizer's settings first, and the lr and the optimizer's
state are read afresh, the Params' values whenever one was rebound since this step rebound
them (`Edits.values`). A step after a bound one tries `repeat` first:
the same checks without the lookups around them (this path runs every step, so its
Python is what a small model's step costs beyond its kernels).
"""

from __future__ import annotations

from itertools import islice
from operator import attrgetter, is_, is_not

from ..frontend.param import Edits
from .update import hyper_inputs, state_inputs

_value = attrgetter("_value")  # what Param.val() returns once the value was read


class BoundStep:
    """One compiled graph bound to one param table: the Params in the order the executable
    binds them, the buffers, Params and optimizer slots its results rebind, and the
    executable's feedback run, which takes those results back as the next step's inputs."""

    def __init__(self, entry, table: dict):
        self.entry, self.table = entry, table
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
        self.dicts: list = [None] * len(self.state_ids)  # the dicts the last step found
        self.slot_dicts: list = [None] * len(self.slots)  # each slot's dict among them
        self.rng = entry.rng_index is not None
        self.scaled = "ember.loss_scale" in entry.graph.attributes  # fed after the inputs
        self.layout = layout
        # the state is the graph's last arguments (passes/optimizer.py); fed in this order:
        # the rebound Params the graph reads, then the slots
        first = len(entry.graph.args) - len(layout.state)
        keys = set(exe.param_keys)
        feeds: dict[int, int | str] = {user + k: pid for k, pid in enumerate(rebound)
                                       if pid in keys}
        self.fed = [table[pid] for pid in feeds.values()]
        self.values_seen = -1  # `Edits.values` after this rebound the Params (none yet)
        feeds.update({self.cuts[1] + k: first + k for k in range(len(layout.state))})
        # the loss is read as a float at once; params and optimizer state (not buffers,
        # which the forward updates before the loss is known) are updated in place where
        # the schedule allows (bound.py `overwrites`)
        donate = [r for r in feeds if r >= user + len(entry.buffer_ids)]
        self.run = exe.feedback(feeds, scratch=(0,), donate=donate)
        # the user's inputs lead the arguments (the rng counter among them): where the
        # bound call checks them all, `repeat` leaves them to it
        users = [k for k in range(len(entry.specs) + self.rng) if k != entry.rng_index]
        self.inputs = len(users) if self.run.checks_args.issuperset(users) else None

    @classmethod
    def of(cls, step, entry, table: dict) -> BoundStep | None:
        """The bound step, or None where the general path runs: a backend without
        `feedback`, params on a device, or a result whose type is not its Param's (which
        `set_value` would convert)."""
        if step.on_device or not hasattr(entry.run, "feedback"):
            return None
        user, end = entry.cuts
        ids = (*entry.buffer_ids, *entry.update_layout.updates)
        types = [v.type for v in entry.graph.return_op.operands[user:user + len(ids)]]
        if any(t.shape != table[pid].shape or t.dtype != table[pid].dtype
               for t, pid in zip(types, ids)):
            return None
        return cls(entry, table)

    def state(self, opt) -> list:
        """Each slot's value in the optimizer's state, made (zeros) by `opt.slot` where
        missing; the dicts holding them kept for the next step. A slot of another shape
        fails the run, and `opt.slot` then says what is wrong (`__call__`)."""
        if not self.found(opt.state):
            self.dicts = list(map(opt.state.get, self.state_ids))
        try:
            values = list(map(dict.__getitem__, map(self.dicts.__getitem__, self.groups),
                              self.names))
        except (KeyError, TypeError):  # a param's slots, or one of them, not made yet
            values = state_inputs(opt, self.layout, self.table)
            self.dicts = list(map(opt.state.get, self.state_ids))
        self.slot_dicts = list(map(self.dicts.__getitem__, self.groups))
        return values

    def found(self, state: dict) -> bool:
        """Whether the optimizer's state holds exactly the dicts the last step found, by
        identity (ParamId hashes in Python, so looking each up again costs more)."""
        return len(state) == len(self.dicts) and all(map(is_, state, self.state_ids)) \
            and all(map(is_, state.values(), self.dicts))

    def __call__(self, step, entry, inputs: tuple):
        """One training step on `entry` (which holds this), as the general path (`execute`,
        `finish`, `write_back`) runs it."""
        if not entry.native_checks:
            step.check_inputs(entry, inputs)
        return self._step(step, inputs, True)

    def repeat(self, step, inputs: tuple):
        """The last step once more, for a step whose last call ran this bound: where
        `TrainStep.__call__` would find this again (the same param table, its tree
        unchanged; inputs of the same types, shapes and dtypes; the same flags,
        requires_grad and optimizer settings: what `entry()` checks, checked here without
        the calls around them, since this runs on every step; the inputs left to the bound
        call where it checks them all, `inputs`) and every fed Param and slot holds what
        the last step left there. Else None, having run nothing."""
        last = step._last_key
        if last.entry is not self.entry or not step.param_table.holds(self.table) or not (
                last.unchanged(self.table) if len(inputs) == self.inputs
                else last.matches(inputs, self.table)):
            return None
        return self._step(step, inputs, False)

    @property
    def repeats(self) -> bool:
        """Whether `repeat` may run the next step: the backend checks the inputs."""
        return self.entry.native_checks

    def _step(self, step, inputs: tuple, general: bool):
        """The feedback run's bound call where every fed Param and slot holds what the last
        step left there, else (when `general`; None otherwise, having run nothing) its
        general call, which holds no turn; then the loss kept, the buffers, Params and slots
        rebound to their new arrays, the step counted."""
        opt, run, turn = step.optimizer, self.run, self.run.turn
        head = [*(step.arguments(self.entry, inputs) if self.rng else inputs),
                *((step.scaler.scale,) if self.scaled else ()), *hyper_inputs(opt)]
        try:
            outs = None
            if turn is not None and self.fed_unchanged(opt, turn.fed):
                outs = run.call(turn, head, self.values() if run.binds_params else ())
            bound = outs is not None
            if not bound:
                if not general:
                    return None
                state = self.state(opt) if self.slots else []
                outs = run([*head, *state], self.values(), self.given_up(state))
        except Exception as e:  # a slot of another shape: state_inputs says so
            args = [*head, *state_inputs(opt, self.layout, self.table)]
            step.explain(self.entry, args, step.params(self.table), e)
            raise
        user, end = self.cuts
        step.keep_loss(outs[:user], self.entry)
        for p, value in zip(self.rebound, outs[user:end]):
            p._value = value  # set_value's own case: a C-contiguous array of the Param's type
        Edits.values += 1  # counted as set_value counts: another bound step looks again
        if not bound:  # (the first step: the Params' initial values may go)
            for p in self.rebound:
                p._forget_initial()
        self.values_seen = Edits.values
        step.rng_step += 1
        if self.slots:
            for d, name, value in zip(self.slot_dicts, self.names, outs[end:]):
                d[name] = value
        if not step.skipped:
            opt.step_count += 1
        return step.loss if not step.metrics else (step.loss, *step.metrics)

    def fed_unchanged(self, opt, fed: tuple) -> bool:
        """Whether every fed Param and slot holds the array of `fed` (the turn's): the
        Params looked at only when a value was rebound since this step rebound them (the
        optimizer's state dicts are the user's, so always)."""
        if Edits.values != self.values_seen \
                and not all(map(is_, map(_value, self.fed), fed)):
            return False
        return not self.slots or (self.found(opt.state) and all(map(
            is_, map(dict.get, self.slot_dicts, self.names), islice(fed, len(self.fed), None))))

    def given_up(self, state: list) -> frozenset[int]:
        """The fed arrays the first update may write over (the general call's `owned`):
        each Param's initial value that it alone holds, and the optimizer's state (zeros
        it made, or what an earlier step or a checkpoint left: all its own)."""
        initial = (p.initial_array() for p in self.fed)
        return frozenset(id(a) for a in (*initial, *state) if a is not None)

    def values(self) -> list:
        """Every Param's value, in the order the executable binds them."""
        values = list(map(_value, self.params))  # val() but in C, once all are read
        return values if all(map(is_not, values, self.nones)) else [p.val() for p in self.params]


__all__ = ["BoundStep"]
