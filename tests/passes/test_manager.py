"""Pipeline text, options, ordering checks, verification, IR dumps, stage callbacks, timing."""

import io
from dataclasses import dataclass
from typing import ClassVar

import pytest

from ember.ir import Builder, Graph, TensorType, VerifyError
from ember.passes import PASSES, Pass, PassManager, PipelineError, parse_pipeline, register_pass
from ember.passes.decompose import Decompose


@register_pass
@dataclass(frozen=True)
class Knobs(Pass):
    """A test pass with one option of every kind."""

    name: ClassVar[str] = "test-knobs"
    count: int = 1
    scale: float = 0.5
    flag: bool = False
    label: str = "x"

    def apply(self, graph):
        return graph


@register_pass
@dataclass(frozen=True)
class Breaker(Pass):
    """Leaves a graph without a terminator, for verify_each."""

    name: ClassVar[str] = "test-break"

    def apply(self, graph):
        graph.return_op.erase()
        return graph


def relu_graph() -> Graph:
    g = Graph("f", [TensorType((4,), "f32")], ["x"])
    b = Builder(g.body)
    b.create("func.return", [b.op("ember.relu", g.args[0])])
    return g


def test_parse_pipeline_names_and_options():
    passes = parse_pipeline("decompose{linear=keep}, autodiff,canonicalize")
    assert [p.name for p in passes] == ["decompose", "autodiff", "canonicalize"]
    assert passes[0] == Decompose(linear="keep")
    assert parse_pipeline("") == [] and parse_pipeline("  ") == []
    assert {"canonicalize", "cse", "dce", "decompose", "autodiff"} <= set(PASSES)


def test_options_convert_to_field_types():
    (k,) = parse_pipeline("test-knobs{count=3 scale=1e-3 flag=true label='a b'}")
    assert (k.count, k.scale, k.flag, k.label) == (3, 1e-3, True, "a b")
    assert str(k) == "test-knobs{count=3 scale=0.001 flag=true label=a b}"
    assert str(parse_pipeline("test-knobs")[0]) == "test-knobs"


@pytest.mark.parametrize("text, message", [
    ("decompose,nope", r"unknown pass 'nope' \(known passes: .*autodiff.*canonicalize"),
    ("decompose{lin=keep}", r"no option 'lin' \(its options: linear\)"),
    ("dce{x=1}", r"no option 'x' \(its options: none\)"),
    ("test-knobs{count=two}", r"bad value 'two' for option 'count' \(expected int\)"),
    ("test-knobs{flag=yes}", r"bad value 'yes' for option 'flag' \(expected true or false\)"),
    ("test-knobs{scale=big}", r"bad value 'big'.*'scale'"),
    ("decompose{linear=fuse}", r"linear='fuse' is not one of split, keep"),
    ("decompose{linear=keep", r"unbalanced"),
    ("decompose{linear}", r"not key=value"),
    ("dce,,cse", r"empty pass name"),
])
def test_pipeline_errors(text, message):
    with pytest.raises(PipelineError, match=message):
        parse_pipeline(text)
    assert issubclass(PipelineError, ValueError)


def test_verify_each_names_the_pass():
    PassManager(parse_pipeline("test-break")).run(relu_graph())  # unchecked: no error
    with pytest.raises(VerifyError, match="after pass 'test-break'"):
        PassManager(parse_pipeline("test-break"), verify_each=True).run(relu_graph())


def test_print_ir_after_all_and_after_one():
    out = io.StringIO()
    PassManager(parse_pipeline("cse,dce"), print_ir_after_all=True, out=out).run(relu_graph())
    text = out.getvalue()
    assert text.count("// -----// IR Dump After ") == 2
    assert text.startswith("// -----// IR Dump After cse //----- //\nmodule {")
    assert '"ember.relu"' in text and "// -----// IR Dump After dce //----- //" in text
    out = io.StringIO()
    PassManager(parse_pipeline("cse,dce"), print_ir_after=["dce"], out=out).run(relu_graph())
    assert out.getvalue().count("IR Dump After") == 1 and "After dce" in out.getvalue()


def test_on_stage_and_timing():
    stages = []
    pm = PassManager(parse_pipeline("canonicalize,cse,dce"),
                     on_stage=lambda name, g: stages.append((name, str(g))))
    pm.run(relu_graph())
    assert [s for s, _ in stages] == ["canonicalize", "cse", "dce"]
    assert all("ember.relu" in text for _, text in stages)
    assert [n for n, _ in pm.timings] == ["canonicalize", "cse", "dce"]
    assert all(t >= 0 for _, t in pm.timings)
    report = pm.timing_report()
    assert "Pass execution timing report" in report and "canonicalize" in report
    assert report.rstrip().endswith("Total")


def test_check_hook_rejects_wrong_order():
    g = Graph("f", [TensorType((3,), "f32")])
    b = Builder(g.body)
    w = b.create("ember.param", [], {"id": "w", "path": "w"},
                 result_types=[TensorType((3,), "f32")]).result
    b.create("func.return", [b.op("ember.reduce_sum", b.op("ember.mul", g.args[0], w),
                                  axes=[0], keepdims=False)])
    with pytest.raises(PipelineError, match="autodiff runs once"):
        PassManager(parse_pipeline("autodiff,autodiff")).run(g)
