"""The packed graph (ir/pack.py), the stage cache's form of a final graph: it unpacks to a
graph that prints as the packed one did, and anything that is not what `pack` makes is a
ValueError, never another error or a graph."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import assert_graphs_equal, graphs, op_graph

from ember.ir import OPS, Builder, Graph, Operation, TensorType
from ember.ir import pack as packing
from ember.ir.printer import print_graph


def roundtrip(g: Graph) -> Graph:
    data = packing.dumps(packing.pack(g))
    back = packing.unpack(packing.loads(data))
    assert print_graph(back) == print_graph(g)
    return back


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_registered_op_roundtrips(name):
    g = op_graph(name)
    assert_graphs_equal(g, roundtrip(g))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_roundtrip(g):
    assert_graphs_equal(g, roundtrip(g))  # locations are not kept: not compared


def mlp_step() -> Graph:
    """A training step's final graph: fused kernels with regions, roles, dense constants."""
    import ember as em
    from ember import nn, optim

    em.seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.AdamW(lr=1e-2),
                                 backend="interpreter")
    step(np.ones((4, 6), np.float32), np.array([0, 1, 2, 0]))
    return step.graph


def test_a_training_step_roundtrips_with_unshared_attributes():
    g = mlp_step()
    back = roundtrip(g)
    assert_graphs_equal(g, back)
    owner: dict[int, Operation] = {}
    for op in back.walk():  # no two ops share a mutable attribute value (as from the parser)
        for v in op.attributes.values():
            if isinstance(v, (list, dict)) or (isinstance(v, np.ndarray) and v.flags.writeable):
                assert owner.setdefault(id(v), op) is op, op.name


def test_every_string_is_in_a_table():
    """What the stage cache numbers param ids in: no string outside the three tables."""
    g = Graph("g", [TensorType((2,), "f32")], ["x"])
    b = Builder(g.body)
    p = b.create("ember.param", [], {"id": "abc", "path": "w", "init": "zeros"},
                 result_types=[TensorType((2,), "f32")]).result
    b.create("func.return", [b.op("ember.add", g.args[0], p)])
    g.attributes["ember.grads"] = ["abc"]
    packed = packing.pack(g)

    def strings(v):
        if isinstance(v, str):
            yield v
        elif isinstance(v, (list, dict)):
            for item in v.values() if isinstance(v, dict) else v:
                yield from strings(item)

    assert list(strings(packed["graph"])) == []
    assert "abc" in "".join(packed["attrs"]) and "g" in packed["names"]


def _valid() -> dict:
    return json.loads(packing.dumps(packing.pack(mlp_step())))


def _first_op_with(p: dict, what) -> list:
    return next(op for op in p["graph"][2][1] if what(op))


MALFORMED = {
    "not json": lambda p: b"module { not a graph",
    "not utf-8": lambda p: b"\xff\xfe",
    "a list": lambda p: [],
    "another format": lambda p: {**p, "format": 2},
    "no tables": lambda p: {"format": 1, "graph": p["graph"]},
    "a table of numbers": lambda p: {**p, "types": [1, 2]},
    "a type that does not parse": lambda p: {**p, "types": ["tensor<2x"] + p["types"][1:]},
    "a type with more text": lambda p: {**p, "types": [p["types"][0] + " x"] + p["types"][1:]},
    "attributes that do not parse": lambda p: {**p, "attrs": ["{a = }"] + p["attrs"][1:]},
    "a name that is no string": lambda p: {**p, "names": [None] * len(p["names"])},
    "no graph": lambda p: {**p, "graph": None},
    "a short graph": lambda p: {**p, "graph": p["graph"][:2]},
}


def _mutate(where):
    def edit(p):
        p = copy.deepcopy(p)
        where(p)
        return p
    return edit


def _set_operand(p, value):
    _first_op_with(p, lambda op: op[1])[1][0] = value


def _set_result_type(p, value):
    _first_op_with(p, lambda op: op[2])[2][0] = value


MALFORMED.update({
    "an operand defined later": _mutate(lambda p: _set_operand(p, 10 ** 6)),
    "a negative operand": _mutate(lambda p: _set_operand(p, -1)),
    "a string operand": _mutate(lambda p: _set_operand(p, "0")),
    "a negative type index": _mutate(lambda p: _set_result_type(p, -1)),
    "a type index past the table": _mutate(lambda p: _set_result_type(p, 10 ** 6)),
    "a float index": _mutate(lambda p: _set_result_type(p, 0.5)),
    "a negative name index": _mutate(lambda p: p["graph"].__setitem__(0, -1)),
    "an op of four fields": _mutate(lambda p: p["graph"][2][1][0].pop()),
    "a block of one field": _mutate(lambda p: p["graph"][2].pop()),
})


@pytest.mark.parametrize("how", MALFORMED)
def test_anything_else_is_a_value_error(how):
    made = MALFORMED[how](_valid())
    data = made if isinstance(made, bytes) else json.dumps(made).encode()
    with pytest.raises(ValueError):
        packing.unpack(packing.loads(data))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_edits_unpack_or_raise_value_errors(data):
    """Any value anywhere in the structure replaced: a graph or a ValueError, nothing else."""
    p = json.loads(packing.dumps(packing.pack(op_graph("kernel.fused"))))
    for _ in range(data.draw(st.integers(1, 3))):
        node, path = p, []
        while isinstance(node, (list, dict)) and node and data.draw(st.booleans()):
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            k = data.draw(st.sampled_from(keys))
            path.append((node, k))
            node = node[k]
        if path:
            parent, k = path[-1]
            parent[k] = data.draw(st.one_of(
                st.none(), st.booleans(), st.integers(-3, 10 ** 6), st.floats(), st.text(),
                st.lists(st.integers(-2, 20), max_size=3)))
    try:
        g = packing.unpack(packing.loads(json.dumps(p).encode()))
    except ValueError:
        return
    assert isinstance(g, Graph)
