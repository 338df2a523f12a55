"""The IR text: what the printer writes, and that parse(print(g)) prints byte-identically."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import (
    EXAMPLES,
    NOTES_GENERIC,
    NOTES_INPUT,
    assert_graphs_equal,
    graphs,
    op_graph,
)

from ember.ir import (
    OPS,
    Builder,
    Graph,
    Location,
    ScalarType,
    TensorType,
    VerifyError,
    numpy_dtype,
    verify,
)
from ember.ir.parser import parse, parse_module
from ember.ir.printer import fmt_attr, print_graph, print_module


def roundtrip(g: Graph, debuginfo: bool = False) -> Graph:
    text = print_graph(g, debuginfo)
    g2 = parse(text)
    assert print_graph(g2, debuginfo) == text
    return g2


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_registered_op_roundtrips(name):
    g = op_graph(name)
    if name in EXAMPLES:
        verify(g)
    assert_graphs_equal(g, roundtrip(g))
    assert any(op.name == name for op in parse(print_graph(g)).walk())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_roundtrip(g):
    assert_graphs_equal(g, roundtrip(g))
    assert_graphs_equal(g, roundtrip(g, debuginfo=True), locs=True)


def test_printed_form():
    g = Graph("forward", [TensorType((32, 64), "f32"), TensorType((32,), "i64")], ["x", None])
    b = Builder(g.body)
    w = b.create("ember.param", [], {"id": "9199rs1gnooc6", "path": "fc1.weight"},
                 [TensorType((64, 10), "f32")]).result
    y = b.op("ember.matmul", g.args[0], w)
    loss = b.op("nn.cross_entropy", y, g.args[1])
    b.create("func.return", [loss, w], loc=Location("model.py", 12, 5))
    g.attributes = {"ember.grads": ["9199rs1gnooc6"]}
    g.loc = Location("model.py", 3, 1)
    assert print_graph(g) == """\
module {
  func.func @forward(%x: tensor<32x64xf32>, %arg1: tensor<32xi64>) -> (tensor<f32>, tensor<64x10xf32>) attributes {ember.grads = ["9199rs1gnooc6"]} {
    %0 = "ember.param"() {id = "9199rs1gnooc6", path = "fc1.weight"} : () -> tensor<64x10xf32>
    %1 = "ember.matmul"(%x, %0) : (tensor<32x64xf32>, tensor<64x10xf32>) -> tensor<32x10xf32>
    %2 = "nn.cross_entropy"(%1, %arg1) : (tensor<32x10xf32>, tensor<32xi64>) -> tensor<f32>
    func.return %2, %0 : tensor<f32>, tensor<64x10xf32>
  }
}
"""  # noqa: E501
    debug = print_graph(g, debuginfo=True)
    assert 'func.return %2, %0 : tensor<f32>, tensor<64x10xf32> loc("model.py":12:5)' in debug
    assert debug.endswith('  } loc("model.py":3:1)\n}\n')
    assert str(g) == print_graph(g)


def test_value_names_keep_valid_unique_hints():
    t = TensorType((), "f32")
    g = Graph("f", [t] * 5, ["x", "x", "0", "arg4", "bad name"])
    Builder(g.body).create("func.return", [])
    assert "@f(%x: tensor<f32>, %arg1: tensor<f32>, %arg2: tensor<f32>, %arg4: tensor<f32>, " \
           "%arg5: tensor<f32>)" in print_graph(g)
    assert [a.name for a in parse(print_graph(g)).args] == ["x", "arg1", "arg2", "arg4", "arg5"]


@pytest.mark.parametrize("value, text", [
    (True, "true"), (False, "false"), (3, "3"), (-2**63, "-9223372036854775808"),
    (0.5, "0.5 : f64"), (1e-05, "1.0e-05 : f64"), (1e20, "1.0e+20 : f64"), (-0.0, "-0.0 : f64"),
    (0.5773502691896258, "0.5773502691896258 : f64"),
    (math.inf, "0x7FF0000000000000 : f64"), (-math.inf, "0xFFF0000000000000 : f64"),
    ('a"b\\c\n€', r'"a\22b\\c\0A\E2\82\AC"'), ([1, 2], "[1, 2]"), ([], "[]"),
    (["a", 1.5, True, [math.nan]], '["a", 1.5, true, [0x7FF8000000000000 : f64]]'),
    ({"b": 1, "a.b": "x", "c d": []}, '{a.b = "x", b = 1, "c d" = []}'),
    (TensorType((2, 3), "bf16"), "tensor<2x3xbf16>"), (ScalarType("i1"), "i1"),
    (np.full((2, 3), 0.1, np.float32), "dense<0.1> : tensor<2x3xf32>"),
    (np.array(2.5, np.float64), "dense<2.5> : tensor<f64>"),
    (np.array([[1, 2], [3, 4]], np.int32), "dense<[[1, 2], [3, 4]]> : tensor<2x2xi32>"),
    (np.array([True, False]), "dense<[true, false]> : tensor<2xi1>"),
    (np.zeros((2, 0), np.float32), "dense<> : tensor<2x0xf32>"),
    (np.array([1e-45, 3.4028235e38, np.nan, -np.inf, 1e-5], np.float32),
     "dense<[1.0e-45, 3.4028235e+38, 0x7FC00000, 0xFF800000, 1.0e-05]> : tensor<5xf32>"),
    (np.array([0.1, 65504, np.inf], np.float16), "dense<[0.1, 6.55e+04, 0x7C00]> : tensor<3xf16>"),
    (np.array([1.5, 0.1, -np.inf, np.nan], numpy_dtype("bf16")),
     "dense<[1.5, 0.100098, 0xFF80, 0x7FC0]> : tensor<4xbf16>"),
    (np.array([0.0, -0.0], np.float64), "dense<[0.0, -0.0]> : tensor<2xf64>"),
])
def test_attribute_text(value, text):
    assert fmt_attr(value) == text
    g = Graph("f")
    Builder(g.body).create("test.op", [], {"v": value}, [])
    parsed = parse(print_graph(g)).ops[0].attributes["v"]
    if isinstance(value, np.ndarray):
        assert parsed.dtype == value.dtype and parsed.shape == value.shape
        assert parsed.tobytes() == value.tobytes()
    else:
        assert fmt_attr(parsed) == text


def test_float_elements_roundtrip_exactly():
    rng = np.random.default_rng(0)
    for dtype in (np.float16, np.float32, np.float64):
        bits = rng.integers(0, 2**16 if dtype == np.float16 else 2**32, 2000, dtype=np.uint64)
        a = bits.astype({np.float16: np.uint16, np.float32: np.uint32,
                         np.float64: np.uint64}[dtype])
        a = (a if dtype != np.float64 else a * 2**31 + 12345).view(dtype)
        g = Graph("f")
        Builder(g.body).create("test.op", [], {"v": a}, [])
        assert parse(print_graph(g)).ops[0].attributes["v"].tobytes() == a.tobytes()


def test_parses_mlir_opt_forms():
    """The example of notes/mlir-text.md in ember's form and in mlir-opt's generic form."""
    a, b = parse(NOTES_INPUT), parse(NOTES_GENERIC)
    assert_graphs_equal(a, b)
    assert b.loc == a.loc == Location("model.py", 12, 5)
    assert [op.loc for op in b.ops[:4]] == [Location("model.py", 7, 9), None, None,
                                            Location("c.py", 5, 6)]
    assert a.ops[0].attributes["gain"] == b.ops[0].attributes["gain"] == 0.5773502691896258
    assert b.args[0].name == "arg0" and a.args[0].name == "x"
    assert b.ops[4].attributes["value"].dtype == np.float32


def test_custom_form_variants():
    g = parse("""
    module attributes {test.flag} {
      func.func @"my f"(%arg0: tensor<2xf32>) -> (tensor<2xf32>) {
        %0:2 = "test.two"(%arg0) {n = 3 : i32, u, h = 0x7FC00000 : f32} : (tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>)
        %1 = "ember.add"(%0#1, %0) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>  // note
        return %1 : tensor<2xf32>
      }
    }""")  # noqa: E501
    two, add, ret = g.ops
    assert g.name == "my f" and ret.name == "func.return"
    assert add.operands == [two.results[1], two.results[0]]
    assert two.attributes["n"] == 3 and two.attributes["u"] is True
    assert math.isnan(two.attributes["h"])
    assert '@"my f"(' in print_graph(g)
    assert_graphs_equal(g, roundtrip(g))


def test_hex_dense_as_mlir_opt_prints_it():
    """mlir-opt prints elements attributes of more than 100 elements as raw hex."""
    a = np.linspace(0, 1, 1000, dtype=np.float32)
    f16 = np.array([1.5, -2.25] * 60, np.float16)
    bools = np.array([True, False] * 60)
    text = f"""func.func @f() {{
      "test.op"() {{a = dense<"0x{a.tobytes().hex().upper()}"> : tensor<1000xf32>,
                    b = dense<"0x{f16.tobytes().hex()}"> : tensor<120xf16>,
                    c = dense<"0x{np.packbits(bools, bitorder='little').tobytes().hex()}"> : tensor<120xi1>,
                    d = dense<"0x0000C03F"> : tensor<200xf32>,
                    e = dense<"0xC03F10C0"> : tensor<2xbf16>,
                    f = dense<"0xFF"> : tensor<3x3xi1>,
                    g = dense<"0x0100000002000000"> : tensor<2xi32>}} : () -> ()
      return
    }}"""  # noqa: E501
    attrs = parse(text).ops[0].attributes
    assert attrs["a"].tobytes() == a.tobytes()
    assert attrs["b"].tobytes() == f16.tobytes() and attrs["b"].dtype == np.float16
    assert (attrs["c"] == bools).all()
    assert attrs["d"].shape == (200,) and (attrs["d"] == 1.5).all()
    assert attrs["e"].tolist() == [1.5, -2.25] and attrs["e"].dtype == numpy_dtype("bf16")
    assert attrs["f"].all() and attrs["f"].shape == (3, 3)
    assert attrs["g"].tolist() == [1, 2]


def test_huge_splat_is_not_allocated():
    g = parse('func.func @f() {\n"test.op"() {v = dense<1.0> : tensor<100000x100000xf32>} : '
              '() -> ()\n}')
    v = g.ops[0].attributes["v"]
    assert v.shape == (100000, 100000) and v.strides == (0, 0)
    assert "dense<1.0> : tensor<100000x100000xf32>" in print_graph(g)


def test_parse_module_and_print_module():
    a, b = op_graph("ember.add"), op_graph("nn.linear")
    b.name = "other"
    gs = parse_module(print_module([a, b]))
    assert [g.name for g in gs] == ["forward", "other"]
    assert_graphs_equal(gs[1], b)


def test_unknown_op_of_own_dialect_fails_verification():
    text = """module {
  func.func @forward(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "ember.frobnicate"(%x) {level = 11} : (tensor<3xf32>) -> tensor<3xf32>
    func.return %0 : tensor<3xf32>
  }
}
"""
    g = parse(text)
    assert print_graph(g) == text
    with pytest.raises(VerifyError, match="ember.frobnicate"):
        verify(g)


def test_unregistered_dialect_op_roundtrips_and_verifies():
    text = """module {
  func.func @forward(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "foo.bar"(%x) ({
    ^bb0(%a: f32):
      "foo.yield"(%a) : (f32) -> ()
    }) {mode = "fast"} : (tensor<3xf32>) -> tensor<3xf32>
    func.return %0 : tensor<3xf32>
  }
}
"""
    g = parse(text)
    assert print_graph(g) == text
    assert verify(g) is g
