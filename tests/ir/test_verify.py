"""The verifier on hand-written IR: every broken rule is a VerifyError that names the op and
what is wrong (and, for parsed text, its line:col), never another exception; and a kernel
that verifies is one the backends compute."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends import interpreter
from ember.ir import OPS, Builder, Graph, TensorType, VerifyError, verify
from ember.ir.parser import parse
from ember.ir.printer import print_graph

HEAD = "func.func @f(%x: tensor<2x3xf32>, %l: tensor<2xi64>) -> tensor<2x3xf32> {\n"
RET = "  func.return %x : tensor<2x3xf32>\n}\n"


def one_op(line: str) -> str:
    """A graph whose second line is `line` (so an error there is at 2:3)."""
    return HEAD + "  " + line + "\n" + RET


def fused(body: str, attrs: str, result: str = "tensor<2x3xf32>",
          args: str = "%a: f32", operands: str = "%x", types: str = "tensor<2x3xf32>") -> str:
    """A graph holding one `kernel.fused` with this body and these attributes, at 2:3."""
    return (HEAD + f'  %k = "kernel.fused"({operands}) ({{\n  ^bb0({args}):\n{body}  }}) '
            f"{{{attrs}}} : ({types}) -> {result}\n" + RET)


ELEMENTWISE = "maps = [[3, 1]], out_maps = [[3, 1]], out_types = [tensor<2x3xf32>], space = [2, 3]"
YIELD_A = '    "kernel.yield"(%a) : (f32) -> ()\n'

BAD_ATTRIBUTES = [
    ('%0 = "ember.broadcast"(%x) {shape = [-2, 3]} : (tensor<2x3xf32>) -> tensor<2x3xf32>',
     "ember.broadcast attribute 'shape' must be a list of dimensions >= 0, got [-2, 3]"),
    ('%0 = "ember.broadcast"(%x) {shape = [4, -1]} : (tensor<2x3xf32>) -> tensor<2x3xf32>',
     "must be a list of dimensions >= 0"),
    ('%0 = "ember.one_hot"(%l) {num_classes = -1, dtype = "f32"} : (tensor<2xi64>) -> '
     "tensor<2x1xf32>", "ember.one_hot attribute 'num_classes' must be an integer >= 0, got -1"),
    ('%0 = "ember.one_hot"(%l) {num_classes = 3, dtype = "i8"} : (tensor<2xi64>) -> '
     "tensor<2x3xf32>", "ember.one_hot attribute 'dtype' must be one of f32, f64"),
    ('%0 = "ember.one_hot"(%l) {num_classes = 3, dtype = 4} : (tensor<2xi64>) -> '
     "tensor<2x3xf32>", "ember.one_hot attribute 'dtype' must be str, got 4"),
    ('%0 = "ember.one_hot"(%l) {num_classes = 99999999999999999999, dtype = "f32"} : '
     "(tensor<2xi64>) -> tensor<2x3xf32>",
     "attribute 'num_classes': 99999999999999999999 does not fit in 64 bits"),
    ('%0 = "ember.reshape"(%x) {shape = [100000000000000000000000]} : (tensor<2x3xf32>) -> '
     "tensor<6xf32>", "attribute 'shape': 100000000000000000000000 does not fit in 64 bits"),
    ('%0 = "ember.reshape"(%x) {shape = [-2, -3]} : (tensor<2x3xf32>) -> tensor<6xf32>',
     "must be a list of dimensions >= 0"),
    ('%0 = "ember.reshape"(%x) {shape = [4294967296, 4294967296, 0]} : (tensor<2x3xf32>) -> '
     "tensor<6xf32>", "cannot reshape [2, 3] to [4294967296, 4294967296, 0]"),
    ('%0 = "ember.reshape"(%x) {shape = 6} : (tensor<2x3xf32>) -> tensor<6xf32>',
     "ember.reshape attribute 'shape' must be a list of integers, got 6"),
    ('%0 = "ember.reshape"(%x) : (tensor<2x3xf32>) -> tensor<6xf32>',
     "ember.reshape needs attribute 'shape'"),
    ('%0 = "ember.transpose"(%x) {perm = [1.0, 0.0]} : (tensor<2x3xf32>) -> tensor<3x2xf32>',
     "attribute 'perm' must be a list of integers"),
    ('%0 = "ember.cast"(%x) {dtype = "f8"} : (tensor<2x3xf32>) -> tensor<2x3xf32>',
     "ember.cast attribute 'dtype' must be one of"),
    ('%0 = "ember.constant"() {value = 3} : () -> tensor<2xf32>',
     "ember.constant attribute 'value' must be ndarray, got 3"),
    ('%0 = "ember.scatter_add"(%l, %x) {shape = [-2, 3]} : (tensor<2xi64>, tensor<2x3xf32>) -> '
     "tensor<2x3xf32>", "ember.scatter_add attribute 'shape' must be a list of dimensions"),
    ('%0 = "ember.dropout"(%x, %l) {p = 0.5, seed = 1, key = 18446744073709551616} : '
     "(tensor<2x3xf32>, tensor<2xi64>) -> tensor<2x3xf32>", "does not fit in 64 bits"),
    ('%0 = "nn.layer_norm"(%x) {axes = [1], eps = 1' + "0" * 30 + "} : (tensor<2x3xf32>) -> "
     "tensor<2x3xf32>", "nn.layer_norm attribute 'eps': 1" + "0" * 30 + " does not fit"),
    ('%0 = "ember.avg_pool2d_grad"(%x) {kernel = [1, 1], stride = [1, 1], padding = [0, 0], '
     "input_shape = [1, 1, -1, 3]} : (tensor<2x3xf32>) -> tensor<2x3xf32>",
     "attribute 'input_shape' must be a list of dimensions >= 0"),
    ('%0 = "ember.broadcast"(%x) {shape = [99999999999, 99999999999, 2, 3]} : '
     "(tensor<2x3xf32>) -> tensor<99999999999x99999999999x2x3xf32>",
     "result 0: tensor<99999999999x99999999999x2x3xf32> has 59999999998800000000006 elements, "
     "more bytes than int64 offsets address"),
    ('%0 = "ember.param"() {id = "a", path = "w"} : () -> f32',
     "op 'ember.param': result 0 must be a tensor, got f32"),
    ('%0 = "kernel.add"(%x, %x) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>',
     "op 'kernel.add' is a scalar op: it belongs in the body of a kernel.fused"),
    ('%0 = "ember.relu"(%x) ({\n  }) : (tensor<2x3xf32>) -> tensor<2x3xf32>',
     "op 'ember.relu' takes no regions"),
]

BAD_KERNELS = [
    (fused('    "kernel.yield"(%a, %a) : (f32, f32) -> ()\n', ELEMENTWISE),
     "kernel.fused: kernel.yield gives (f32, f32), results are (f32)"),
    (fused('    "kernel.yield"() : () -> ()\n', ELEMENTWISE),
     "kernel.fused: kernel.yield gives (), results are (f32)"),
    (fused(YIELD_A, ELEMENTWISE, args="%a: f32, %b: f32"),
     "kernel.fused: block arguments (f32, f32) must be (f32)"),
    (fused('    "kernel.yield"(%a) : (i64) -> ()\n', ELEMENTWISE, args="%a: i64"),
     "block arguments (i64) must be (f32)"),
    (fused(YIELD_A, ELEMENTWISE.replace("maps = [[3, 1]], out", "maps = [[3]], out")),
     "the map of operand 0 must be 2 strides >= 0 (one per space dim, each fitting in 64 "
     "bits), got [3]"),
    (fused(YIELD_A, "maps = [[3, 1, 10000000000000000000]], out_maps = [[3, 1, 0]], "
                    "out_types = [tensor<2x3xf32>], space = [2, 3, 1]"),
     "the map of operand 0 must be 3 strides >= 0"),
    (fused(YIELD_A, ELEMENTWISE.replace("maps = [[3, 1]], out", "maps = [], out")),
     "kernel.fused: 1 operands but 0 maps"),
    (fused(YIELD_A, ELEMENTWISE.replace("out_maps = [[3, 1]]", "out_maps = [[1, 0]]")),
     "out map [1, 0] over space [2, 3] writes 2 elements of result 0 (tensor<2x3xf32>), "
     "which has 6"),
    (fused(YIELD_A, ELEMENTWISE.replace("out_maps = [[3, 1]]", "out_maps = [[1, 1]]")),
     "does not write every element of result 0"),
    (fused(YIELD_A, ELEMENTWISE.replace("out_maps = [[3, 1]]", "out_maps = [[3, 1, 0]]")),
     "the map of result 0 must be 2 strides >= 0"),
    (fused(YIELD_A, ELEMENTWISE.replace("maps = [[3, 1]], out", "maps = [[3, 2]], out")),
     "the map [3, 2] of operand 0 (tensor<2x3xf32>) reads past its 6 elements"),
    (fused(YIELD_A, ELEMENTWISE.replace("space = [2, 3]", "space = [99999999999, 99999999999]")),
     "space [99999999999, 99999999999] has more points than int64 counts"),
    (fused('    %s = "kernel.add"(%a, %a) : (f32, f32) -> f32\n', ELEMENTWISE),
     "block ends with 'kernel.add', which is not a terminator"),
    (fused('    %s = "ember.relu"(%a) : (f32) -> f32\n' + YIELD_A, ELEMENTWISE),
     "op 'ember.relu' cannot be in the body of kernel.fused: a kernel body holds scalar "
     "kernel ops only"),
    (fused('    %s = "test.op"(%a) : (f32) -> f32\n' + YIELD_A, ELEMENTWISE),
     "op 'test.op' cannot be in the body of kernel.fused"),
    (fused('    %s = "kernel.add"(%a, %x) : (f32, tensor<2x3xf32>) -> f32\n' + YIELD_A,
           ELEMENTWISE), "op 'kernel.add' uses operand #1 from outside the body of kernel.fused"),
    (fused('    %s = "kernel.constant"() {value = 0.5 : f64} : () -> i64\n' + YIELD_A,
           ELEMENTWISE), "kernel.constant: value 0.5 does not fit its result type i64"),
    (fused('    %s = "kernel.constant"() {value = 2} : () -> i1\n' + YIELD_A, ELEMENTWISE),
     "kernel.constant: value 2 does not fit its result type i1"),
    (fused('    %s = "kernel.constant"() {value = 4294967296} : () -> i32\n' + YIELD_A,
           ELEMENTWISE), "kernel.constant: value 4294967296 does not fit its result type i32"),
    (fused('    %s = "kernel.constant"() {value = 1.0 : f64} : () -> tensor<f32>\n' + YIELD_A,
           ELEMENTWISE), "op 'kernel.constant': result 0 must be a scalar (f32, i64, ...)"),
    (fused('    %i = "kernel.index"() {dim = 2} : () -> i64\n' + YIELD_A, ELEMENTWISE),
     "kernel.index dim out of range for a space of rank 2"),
    (fused('    %i = "kernel.index"() {dim = 0} : () -> f32\n' + YIELD_A, ELEMENTWISE),
     "kernel.index gives i64, not f32"),
    (fused('    %r = "kernel.reduce"(%a) {dims = [1, 1], kind = "add"} : (f32) -> f32\n'
           '    "kernel.yield"(%r) : (f32) -> ()\n', ELEMENTWISE),
     "kernel.reduce needs distinct dims, at least one, got [1, 1]"),
    (fused('    %r = "kernel.reduce"(%a) {dims = [0], kind = "add"} : (f32) -> f32\n'
           '    %s = "kernel.reduce"(%a) {dims = [1], kind = "add"} : (f32) -> f32\n'
           '    %t = "kernel.add"(%r, %s) : (f32, f32) -> f32\n'
           '    "kernel.yield"(%t) : (f32) -> ()\n', ELEMENTWISE),
     "every kernel.reduce must reduce the same dims"),
    (fused(YIELD_A, ELEMENTWISE.replace("out_maps = [[3, 1]], out_types = [tensor<2x3xf32>]",
                                        "out_maps = [[1, 0]], out_types = [tensor<2xf32>]"),
           result="tensor<2xf32>"),
     "result 0 varies along space dim 1 but its out map has stride 0 there"),
    (fused(YIELD_A + '  ^bb1:\n    "kernel.yield"() : () -> ()\n', ELEMENTWISE),
     "kernel.fused needs one region with one block"),
    (HEAD + '  %k = "kernel.fused"(%x) {' + ELEMENTWISE + "} : (tensor<2x3xf32>) -> "
     "tensor<2x3xf32>\n" + RET, "kernel.fused needs one region with one block"),
    (HEAD + '  %k = "kernel.matmul"(%x, %x) ({\n  ^bb0(%acc: f32):\n'
     '    %r = "kernel.reduce"(%acc) {dims = [0], kind = "add"} : (f32) -> f32\n'
     '    "kernel.yield"(%r) : (f32) -> ()\n  }) {maps = [[3, 0, 1], [0, 3, 1]], '
     "out_maps = [[0, 0, 0]], out_types = [tensor<1xf32>], space = [2, 2, 3]} : "
     "(tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<1xf32>\n" + RET,
     "kernel.matmul: an epilogue cannot reduce"),
]


def where_and_what(text: str) -> VerifyError:
    with pytest.raises(VerifyError) as info:
        verify(parse(text))
    return info.value


@pytest.mark.parametrize("line, fragment", BAD_ATTRIBUTES, ids=[f[:40] for _, f in BAD_ATTRIBUTES])
def test_bad_attributes_are_verify_errors_at_the_op(line, fragment):
    e = where_and_what(one_op(line))
    name = line.split('"')[1]
    assert (e.line, e.col) == (2, 3), str(e)
    assert fragment in e.message and f"op '{name}'" in e.message, str(e)
    assert str(e) == f"2:3: error: {e.message}"


@pytest.mark.parametrize("text, fragment", BAD_KERNELS, ids=[f[:40] for _, f in BAD_KERNELS])
def test_bad_kernels_are_verify_errors(text, fragment):
    e = where_and_what(text)
    assert fragment in e.message, str(e)
    assert e.line >= 2 and str(e) == f"{e.line}:{e.col}: error: {e.message}"


def test_error_inside_a_body_points_at_the_body_op():
    e = where_and_what(fused('    %s = "kernel.add"(%a, %x) : (f32, tensor<2x3xf32>) -> f32\n'
                             + YIELD_A, ELEMENTWISE))
    assert (e.line, e.col) == (4, 5)


def test_errors_without_text_have_no_position():
    g = Graph("f", [TensorType((2,), "f32")])
    Builder(g.body).create("func.return", [g.args[0]])
    g.attributes["ember.finite_args"] = [1]
    with pytest.raises(VerifyError) as info:
        verify(g)
    assert info.value.line is None
    assert str(info.value) == ("graph attribute 'ember.finite_args': 1 is not an argument "
                               "index of @f, which has 1 arguments")


def test_positions_are_never_printed():
    g = parse(one_op('%0 = "ember.relu"(%x) : (tensor<2x3xf32>) -> tensor<2x3xf32>'))
    assert g.ops[0].pos == (2, 3) and g.pos == (1, 1)
    assert "2:3" not in print_graph(g) and "loc" not in print_graph(g, debuginfo=True)


def test_a_bug_in_an_op_definition_is_a_verify_error_naming_the_op(monkeypatch):
    def broken(operand_types, attrs):
        return attrs["missing"]

    monkeypatch.setattr(OPS["ember.relu"], "infer", staticmethod(broken))
    e = where_and_what(one_op('%0 = "ember.relu"(%x) : (tensor<2x3xf32>) -> tensor<2x3xf32>'))
    assert e.message == "op 'ember.relu': cannot be checked (KeyError: 'missing')"
    assert (e.line, e.col) == (2, 3)


GRAPH_ATTRS = [
    ("ember.finite_args = 3", "'ember.finite_args' must be a list of argument indices, got 3"),
    ("ember.finite_args = [5]", "5 is not an argument index of @f, which has 2 arguments"),
    ("ember.finite_args = [true]", "True is not an argument index"),
    ("ember.finite_args = [1]", "argument 1 of @f is tensor<2xi64>, not a float tensor"),
    ("ember.label_args = [1, 3]", "'ember.label_args' must be a list of [argument, classes] "
     "or [argument, classes, ignored] lists, got [1, 3]"),
    ("ember.label_args = [[1]]", "must be a list of [argument, classes] or"),
    ('ember.label_args = [[1, 3, "x"]]', "the ignored label of argument 1 must be an integer"),
    ("ember.label_args = [[0, 3]]", "argument 0 of @f is tensor<2x3xf32>, not an integer tensor"),
    ("ember.label_args = [[-1, 3]]", "-1 is not an argument index"),
    ("ember.label_args = [[1, -3]]", "the class count of argument 1 must be an integer in "
     "[0, 9223372036854775807], got -3"),
    ('ember.label_args = [[1, "3"]]', "got '3'"),
]


@pytest.mark.parametrize("attr, fragment", GRAPH_ATTRS, ids=[a for a, _ in GRAPH_ATTRS])
def test_malformed_input_check_attributes(attr, fragment):
    text = HEAD.replace(" {\n", f" attributes {{{attr}}} {{\n") + RET
    e = where_and_what(text)
    assert fragment in e.message and (e.line, e.col) == (1, 1), str(e)


def test_wellformed_input_check_attributes_verify():
    text = HEAD.replace(" {\n", " attributes {ember.finite_args = [0], ember.label_args = "
                                "[[1, 3]]} {\n") + RET
    verify(parse(text))


def test_one_param_id_has_one_type():
    param = '"ember.param"() {{id = "w", path = "fc.weight"}} : () -> tensor<{}xf32>\n'
    e = where_and_what(HEAD + "  %0 = " + param.format("2x3") + "  %1 = " + param.format("3")
                       + RET)
    assert (e.line, e.col) == (3, 3)
    assert e.message == ("op 'ember.param': param id 'w' is tensor<2x3xf32> elsewhere, here "
                         "tensor<3xf32>")


def test_graph_arguments_are_tensors():
    e = where_and_what("func.func @f(%x: f32) {\n  func.return\n}\n")
    assert e.message == "argument 0 of @f must be a tensor, got f32" and e.line == 1


def test_reduce_max_of_nothing_is_the_lowest_value():
    g = parse("func.func @f(%x: tensor<2x0xf32>) -> tensor<2xf32> {\n"
              '  %0 = "ember.reduce_max"(%x) {axes = [1], keepdims = false} : '
              "(tensor<2x0xf32>) -> tensor<2xf32>\n  func.return %0 : tensor<2xf32>\n}\n")
    (out,) = interpreter.run(g, [np.zeros((2, 0), np.float32)])
    assert out.tolist() == [-np.inf, -np.inf]


SOFTMAX_ROWS = """\
func.func @f(%x: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2xf32>) {
  %k:2 = "kernel.fused"(%x) ({
  ^bb0(%a: f32):
    %m = "kernel.reduce"(%a) {dims = [1], kind = "max"} : (f32) -> f32
    %d = "kernel.sub"(%a, %m) : (f32, f32) -> f32
    %e = "kernel.exp"(%d) : (f32) -> f32
    %i = "kernel.index"() {dim = 1} : () -> i64
    %c = "kernel.cast"(%i) {dtype = "f32"} : (i64) -> f32
    %y = "kernel.mul"(%e, %c) : (f32, f32) -> f32
    "kernel.yield"(%y, %m) : (f32, f32) -> ()
  }) {maps = [[3, 1]], out_maps = [[3, 1], [1, 0]], out_types = [tensor<2x3xf32>, tensor<2xf32>],
      space = [2, 3]} : (tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2xf32>)
  func.return %k#0, %k#1 : tensor<2x3xf32>, tensor<2xf32>
}
"""


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_a_handwritten_kernel_that_verifies_computes(backend):
    from ember.backends import cpu

    g = verify(parse(SOFTMAX_ROWS))
    x = np.array([[1, 2, 3], [0, -1, 5]], np.float32)
    y, m = (interpreter if backend == "interpreter" else cpu).compile(g)([x])
    want_m = x.max(axis=1)
    np.testing.assert_allclose(m, want_m)
    np.testing.assert_allclose(y, np.exp(x - want_m[:, None]) * np.arange(3), rtol=1e-6)


EMPTY_ROW_MAX = """\
func.func @f(%x: tensor<3x0xf32>) -> tensor<0xf32> {
  %0 = "kernel.fused"(%x) ({
  ^bb0(%a: f32):
    %r = "kernel.reduce"(%a) {dims = [1], kind = "max"} : (f32) -> f32
    "kernel.yield"(%r) : (f32) -> ()
  }) {maps = [[0, 1]], out_maps = [[1, 0]], out_types = [tensor<0xf32>], space = [3, 0]} :
     (tensor<3x0xf32>) -> tensor<0xf32>
  func.return %0 : tensor<0xf32>
}
"""


def test_an_empty_kernel_runs_on_the_interpreter():
    (out,) = interpreter.run(verify(parse(EMPTY_ROW_MAX)), [np.zeros((3, 0), np.float32)])
    assert out.shape == (0,)
