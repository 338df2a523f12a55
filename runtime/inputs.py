"""The checks the runtime runs on a compiled function's inputs in Python: which inputs
are class labels (and what range, and ignore_index, they must keep to), batch sizes that
agree, float inputs without NaN/Inf. A backend that compiles the checks in (cpu) runs
them natively; these give the detailed message.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Operation, is_float

# ops whose result holds exactly its operand's values, rearranged: labels reshaped or
# transposed on their way to the loss (a language model's [batch, T] targets flattened)
# are an input's labels all the same
_SAME_VALUES = frozenset({"ember.reshape", "ember.transpose"})


def label_inputs(graph: Graph) -> tuple:
    """Class labels that come from an input (as they are, or reshaped or transposed), with
    their number of classes (and the ignore_index the loss skips, if any): checked before
    each run, since an out-of-range label would otherwise drop out of the loss."""
    args = {a: i for i, a in enumerate(graph.args)}
    found = dict.fromkeys((_source(label[0]), *label[1:]) for op in graph.ops
                          if (label := _label_of(op)) is not None)
    return tuple((args[value], *rest) for value, *rest in found if value in args)


def _source(value):
    """The value that `value` rearranges (through reshapes and transposes), else itself."""
    while value.op is not None and value.op.name in _SAME_VALUES:
        value = value.op.operands[0]
    return value


def _label_of(op: Operation) -> tuple | None:
    """(labels value, number of classes[, ignored label]) of an op that takes class labels,
    else None."""
    if op.name == "nn.cross_entropy":
        ignore = op.attributes.get("ignore_index")
        return (op.operands[1], op.operands[0].type.shape[-1],
                *(() if ignore is None else (ignore,)))
    if op.name == "ember.one_hot":  # cross_entropy with weights or smoothing, nll_loss
        labels = op.operands[0]
        return labels, op.attributes["num_classes"], *_compared_away(labels)
    return None


def _compared_away(labels) -> tuple:
    """(v,) when the graph tests `labels != v` for a constant v (a loss's ignore_index,
    which masks those rows out), else ()."""
    for op, _ in labels.uses:
        if op.name == "ember.cmp" and op.attributes["predicate"] == "ne":
            other = op.operands[1] if op.operands[0] is labels else op.operands[0]
            if other.op is not None and other.op.name == "ember.constant" \
                    and other.type.shape == ():
                return (int(other.op.attributes["value"]),)
    return ()


def check_labels(labels: tuple, inputs: tuple) -> None:
    """Each (input, classes[, ignored]) of `labels` holds class ids in range: an
    out-of-range label would otherwise drop out of the loss silently."""
    for i, c, *ignore in labels:
        y = np.asarray(inputs[i])
        out = (y < 0) | (y >= c)
        if ignore:
            out &= y != ignore[0]
        if out.any():
            bad = np.unique(y[out])[:5].tolist()
            skipped = f" or {ignore[0]} (ignore_index)" if ignore else ""
            raise ValueError(f"labels out of range: input {i} has values {bad} outside "
                             f"[0, {c}){skipped} (the model's output has {c} classes)")


def count(name: str, value, meaning: str) -> int:
    """A count argument checked: an int (numpy's too, not a bool) of at least 1; else a
    TypeError or ValueError naming the argument and what it counts."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int ({meaning}), got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1 ({meaning}), got {value}")
    return int(value)


def model_input_count(n_inputs) -> int:
    """`n_inputs` of a gradient function or training step, checked: how many leading
    arguments of each call go to the model (the rest go to the loss function)."""
    return count("n_inputs", n_inputs, "how many leading arguments of each call go to the "
                 "model")


def argument_role(i: int, n_inputs: int) -> str:
    """What argument `i` of a call is: "model input k" or "loss argument k"."""
    return f"model input {i}" if i < n_inputs else f"loss argument {i - n_inputs}"


def check_arguments(inputs: tuple, n_inputs: int) -> None:
    """The call gives the model its `n_inputs` arguments, and every argument that has a
    batch axis (the first) has the same number of rows; the error names the arguments
    that differ from the first one's by index and role, and both sizes."""
    if len(inputs) < n_inputs:
        raise ValueError(f"n_inputs={n_inputs}: the model takes the first {n_inputs} arguments "
                         f"of each call and the loss function the rest, but the call passes "
                         f"{len(inputs)}")
    rows = {i: np.shape(x)[0] for i, x in enumerate(inputs) if np.ndim(x)}
    if len(set(rows.values())) <= 1:
        return
    first, n = next(iter(rows.items()))

    def named(i: int) -> str:
        return f"argument {i} ({argument_role(i, n_inputs)}) has {rows[i]}"

    listed = ", ".join(named(i) for i, r in rows.items() if r != n)
    raise ValueError(f"inputs disagree on the batch size (rows): {listed}, but {named(first)}")


def finite_inputs(inputs: tuple) -> None:
    for i, x in enumerate(inputs):
        x = np.asarray(x)
        if is_float(x.dtype) and not np.isfinite(x).all():
            rows = np.unique(np.nonzero(~np.isfinite(x))[0])[:5].tolist() if x.ndim else []
            raise ValueError(f"input {i} contains NaN or Inf"
                             + (f" (rows {rows}{', ...' if len(rows) == 5 else ''})"
                                if rows else ""))
