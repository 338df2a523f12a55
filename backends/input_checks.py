"""Input checks a runtime asks of a backend, by graph attributes, and the error they raise.

`ember.finite_args = [i, ...]`: float inputs that must hold no NaN or Inf;
`ember.label_args = [[i, c], ...]`: integer inputs (class labels) whose values must lie in
[0, c); `[i, c, v]`: or equal v (the ignore_index of the loss, which skips those rows).
`ir.verify` checks their form (indices of float or integer arguments, class counts that
fit the labels' dtype), so what reads them here may trust it. A backend that runs them
itself (the cpu backend compiles them into its entry, before the first kernel) says so with
`checks_inputs = True` on what it compiled and raises InputCheckError; the runtime then runs
its numpy checks for the detailed message. Other backends leave them to the runtime.
"""

from __future__ import annotations

from ..ir import Graph


class InputCheckError(ValueError):
    """An input failed a check compiled into the graph (NaN/Inf, or a label out of range)."""

    def __init__(self, arg: int, message: str):
        super().__init__(message)
        self.arg = arg


def input_checks(graph: Graph) -> list[tuple[int, int | None, int | None]]:
    """(argument index, label bound or None for "finite", the label allowed besides [0,
    bound) or None) of each check the graph asks for."""
    a = graph.attributes
    return ([(int(i), None, None) for i in a.get("ember.finite_args", ())]
            + [(int(i), int(c), int(ignore[0]) if ignore else None)
               for i, c, *ignore in a.get("ember.label_args", ())])


def describe(check: tuple[int, int | None, int | None]) -> str:
    arg, bound, ignore = check
    if bound is None:
        return f"input {arg} contains NaN or Inf"
    also = f" (other than the ignored {ignore})" if ignore is not None else ""
    return f"input {arg} has labels outside [0, {bound}){also}"
