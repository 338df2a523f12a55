"""The model's params as the runtime sees them: by id string, with the state that keys a compile."""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from ..frontend.module import Module, TreeWatch
from ..frontend.param import Edits, Param, ParamId


def param_table(model: Module) -> dict[str, Param]:
    """Every Param of the model (buffers and flags too), keyed by `str(param.id)`."""
    return model.params_by_id()


class ParamTable:
    """`param_table(model)` for a runtime that asks on every step: the tree is walked again
    only when its TreeWatch says it may have changed (a layer replaced, a list appended)."""

    def __init__(self, model: Module):
        self.model = model
        self._watch: TreeWatch | None = None
        self._table: dict[str, Param] = {}

    def __call__(self) -> dict[str, Param]:
        if not self.holds(self._table):
            self._watch = TreeWatch(self.model)
            self._table = param_table(self.model)
        return self._table

    def holds(self, table: dict[str, Param]) -> bool:
        """Whether a call would return `table` without walking the tree again."""
        return table is self._table and self._watch is not None and self._watch.unchanged()


def param_values(table: dict[str, Param]) -> dict[str, np.ndarray]:
    """Materialize (on first run) and read every param's value."""
    return {pid: p.val() for pid, p in table.items()}


def state_key(table: dict[str, Param]) -> tuple:
    """What a compiled graph bakes in: ids, shapes, flags and requires_grad."""
    return tuple((pid, p.shape, p.kind, p.requires_grad,
                  bool(p.val()) if p.kind == "flag" else None) for pid, p in table.items())


_requires_grad = attrgetter("requires_grad")


class StateWatch:
    """Says cheaply whether `state_key(table)` is still what it was when the watch was made,
    for a runtime that asks on every step: of the same table (ParamTable makes a new dict
    when the tree changed) only requires_grad and flag values can change, since a Param's
    id, shape and kind are fixed. requires_grad is read again only after one was set
    (`Edits.requires_grad`); flags are read every time (an array changed in place)."""

    def __init__(self, table: dict[str, Param]):
        self.table = table
        self.params = tuple(table.values())
        self.flags = tuple(p for p in self.params if p.kind == "flag")
        self.edits = Edits.requires_grad
        self.grads = list(map(_requires_grad, self.params))
        self.flag_values = list(map(bool, self.flags))

    def unchanged(self, table: dict[str, Param]) -> bool:
        return (table is self.table and (self.edits == Edits.requires_grad or self._same_grads())
                and (not self.flags or list(map(bool, self.flags)) == self.flag_values))

    def _same_grads(self) -> bool:
        """requires_grad read again after an edit; where it is what it was, the count the
        next check compares moves up to now."""
        count = Edits.requires_grad
        if list(map(_requires_grad, self.params)) != self.grads:
            return False
        self.edits = count
        return True


class GradientsParams:
    """Gradients keyed by ParamId, only for params that require grad (as burn's)."""

    def __init__(self, grads: dict[ParamId, np.ndarray]):
        self._grads = grads

    def get(self, param: Param | ParamId) -> np.ndarray | None:
        return self._grads.get(param.id if isinstance(param, Param) else param)

    def __getitem__(self, param: Param | ParamId) -> np.ndarray:
        g = self.get(param)
        if g is None:
            raise KeyError(f"no gradient for {param}")
        return g

    def __contains__(self, param: Param | ParamId) -> bool:
        return self.get(param) is not None

    def __len__(self) -> int:
        return len(self._grads)

    def __iter__(self):
        return iter(self._grads)

    def items(self):
        return self._grads.items()

    def __repr__(self) -> str:
        return f"GradientsParams({len(self)} params)"
