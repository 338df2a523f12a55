"""A graph as Graphviz dot (`ember opt --emit dot | dot -Tsvg`): the dataflow at a glance,
one node per op of the function body and one edge per SSA use, as MLIR's
`--view-op-graph` draws it. A kernel's scalar body stays inside its node (its op count is
in the label); values are named as the printed IR names them, so a node can be found in
the text.
"""

from __future__ import annotations

from .core import Graph, Operation, Value
from .printer import GraphPrinter

_SHAPES = {"ember.param": "ellipse", "ember.constant": "ellipse", "func.return": "house"}


def to_dot(graph: Graph) -> str:
    """`digraph "name" { ... }` for the graph's arguments, ops and their uses."""
    names = GraphPrinter(graph, debuginfo=False)
    node: dict[Value, str] = {}
    lines = [f"digraph {_quote(graph.name)} {{",
             '  node [shape=box, fontname="monospace", fontsize=10];']
    for i, a in enumerate(graph.args):
        node[a] = f"arg{i}"
        lines.append(f"  arg{i} [label={_quote(f'{names.value(a)} : {a.type}')}, "
                     "shape=invhouse];")
    for k, op in enumerate(graph.ops):
        node.update((r, f"op{k}") for r in op.results)
        shape = _SHAPES.get(op.name, "box")
        lines.append(f"  op{k} [label={_quote(_label(op, names))}, shape={shape}];")
        lines += [f"  {node[v]} -> op{k};" for v in op.operands]
    return "\n".join(lines) + "\n}\n"


def _label(op: Operation, names: GraphPrinter) -> str:
    results = ", ".join(map(names.value, op.results))
    head = f"{results} = {op.name}" if results else op.name
    path = op.attributes.get("path")
    inner = sum(1 for _ in op.walk()) - 1
    detail = [f"[{path}]"] if isinstance(path, str) else []
    detail += [f"({inner} ops inside)"] if inner else []
    types = ", ".join(str(r.type) for r in op.results)
    return "\n".join([head, *detail, *([types] if types else [])])


def _quote(text: str) -> str:
    """A dot string literal: backslashes and quotes escaped, newlines as line breaks."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
