"""Malformed text gives a ParseError naming line, column and what was expected — and
nothing else: random garbage and mutated valid text never raise any other exception."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import NOTES_GENERIC, NOTES_INPUT, op_graph, random_graph

from ember.ir.parser import ParseError, parse
from ember.ir.printer import print_graph

HEAD = "func.func @f(%x: tensor<3xf32>) -> tensor<3xf32> {\n"
RET = "  func.return %x : tensor<3xf32>\n}\n"

# (input with ¦ where the error is, message fragment); the input's ¦ is removed before parsing
CASES = [
    (HEAD + '  %0 = "ember.relu"(¦%y) : (tensor<3xf32>) -> tensor<3xf32>\n' + RET,
     "use of undefined value '%y'"),
    (HEAD + '  %0 = "ember.relu"(%x) : (tensor<3xf32>) -> tensor<3xf32>\n'
     '  ¦%0 = "ember.relu"(%x) : (tensor<3xf32>) -> tensor<3xf32>\n' + RET,
     "redefinition of value '%0'"),
    (HEAD + '  %0 = "ember.relu"(¦%x) : (tensor<4xf32>) -> tensor<4xf32>\n' + RET,
     "use of '%x' expected type tensor<3xf32> as defined, got tensor<4xf32>"),
    (HEAD + '  %0 = "ember.add"(%x, %x) : ¦(tensor<3xf32>) -> tensor<3xf32>\n' + RET,
     "expected 2 operand types, got 1"),
    (HEAD + '  %0 = "ember.relu"(%x) : ¦(tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>)\n'
     + RET, "expected 1 result type, got 2"),
    ("func.func @f(%x: tensor<3x¦f8>) {\n}\n", "expected a dtype (f32, f64"),
    ("func.func @f(%x: ¦index) {\n}\n", "got unknown type 'index'"),
    ("func.func @f(%x: tensor<¦?x3xf32>) {\n}\n", "expected a static dimension or dtype"),
    (HEAD + '  "test.op"() {s = ¦"abc} : () -> ()\n' + RET,
     "unterminated string: expected '\"'"),
    (HEAD + '  "test.op"() {s = "a¦\\q"} : () -> ()\n' + RET, "expected an escape"),
    (HEAD + '  %0 ¦"ember.relu"(%x) : (tensor<3xf32>) -> tensor<3xf32>\n' + RET,
     "expected ',' or '=', got '\"ember.relu\"'"),
    (HEAD + '  ¦arith.constant 1 : i32\n' + RET, "expected an operation"),
    (HEAD + '  "test.op"() {a = 1, ¦a = 2} : () -> ()\n' + RET, "duplicate attribute 'a'"),
    (HEAD + '  "test.op"() {v = dense<¦[1.0, 2.0]> : tensor<3xf32>} : () -> ()\n' + RET,
     "expected dense shape [3] for tensor<3xf32>, got [2]"),
    (HEAD + '  "test.op"() {v = dense<[1, ¦300]> : tensor<2xi1>} : () -> ()\n' + RET,
     "expected a value in i1's range, got 300"),
    (HEAD + '  "test.op"() {v = dense<¦"0x0102"> : tensor<3xf32>} : () -> ()\n' + RET,
     "expected 12 bytes of hex data for tensor<3xf32>, got 2"),
    (HEAD + '  "test.op"() {v = dense<[1.0, ¦1.0e+39]> : tensor<2xf32>} : () -> ()\n' + RET,
     "expected a value in f32's range, got 1.0e+39"),
    (HEAD + '  "test.op"() : () -> () loc(¦#loc9)\n' + RET,
     "use of undefined location alias '#loc9'"),
    (HEAD + '  "test.op"() {v = ¦(tensor<3xf32>) -> ()} : () -> ()\n' + RET,
     "function types are only supported"),
    (HEAD + "  func.return %x, %x : ¦tensor<3xf32>\n}\n", "expected 2 operand types, got 1"),
    ("func.func @f(%x: tensor<3xf32>) -> tensor<4xf32> {\n  func.return %x : tensor<3xf32>\n"
     "¦}\n", "expected func.return of (tensor<4xf32>) as declared, got (tensor<3xf32>)"),
    ("module {\n  ¦foo\n}\n", "expected 'module' or 'func.func' or '}', got 'foo'"),
    ("func.func @f() {\n}\n¦func.func @g() {\n}\n", "expected exactly one func.func, got 2"),
    ("module {\n}\n¦", "expected exactly one func.func, got 0"),
    ("func.func @f() {\n  ¦; \n}\n", "unexpected character ';'"),
    (HEAD + '  %0:2 = "test.two"() : () -> (f32, f32)\n  "test.use"(¦%0#2) : (f32) -> ()\n' + RET,
     "expected a result number below 2 for '%0', got #2"),
    (HEAD + '  "t.o"() ({\n' * 100 + '  "t.o"() (¦{\n', "nesting deeper than 100 levels"),
    (HEAD + '  "test.op"()¦', "expected ':' and the op's type, got end of input"),
    ('"builtin.module"() ({\n  ¦"func.func"() <{function_type = (f32) -> (), sym_name = "f"}> '
     '({\n  ^bb0(%a: f64):\n    "func.return"() : () -> ()\n  }) : () -> ()\n}) : () -> ()\n',
     "expected block arguments of types (f32) as in function_type, got (f64)"),
]


def where(marked: str) -> tuple[str, int, int]:
    """The text without its ¦ marker, and the marker's 1-based line and column."""
    before, _, after = marked.partition("¦")
    line = before.count("\n") + 1
    return before + after, line, len(before) - (before.rfind("\n") + 1) + 1


@pytest.mark.parametrize("marked, fragment", CASES, ids=[f[:32] for _, f in CASES])
def test_error_position_and_message(marked, fragment):
    text, line, col = where(marked)
    with pytest.raises(ParseError) as info:
        parse(text)
    e = info.value
    assert (e.line, e.col) == (line, col), str(e)
    assert fragment in e.message, str(e)
    assert str(e) == f"{line}:{col}: error: {e.message}"


def test_error_positions_literally():
    """Two positions spelled out, to check the ¦ helper itself."""
    with pytest.raises(ParseError, match=r"^2:21: error: use of undefined value '%y'$"):
        parse(HEAD + '  %0 = "ember.relu"(%y) : (tensor<3xf32>) -> tensor<3xf32>\n' + RET)
    with pytest.raises(ParseError) as info:
        parse("func.func @f(%x: tensor<3xf8>) {\n}\n")
    assert (info.value.line, info.value.col) == (1, 27)
    assert str(info.value).startswith("1:27: error: expected a dtype")


def test_parse_error_is_a_value_error():
    assert issubclass(ParseError, ValueError)


# -- fuzzing ----------------------------------------------------------------------------------

SEEDS = [print_graph(op_graph(n), d) for n in ("nn.linear", "ember.constant") for d in (0, 1)]
SEEDS += [print_graph(random_graph(random.Random(s)), debuginfo=True) for s in range(12)]
SEEDS += [NOTES_INPUT, NOTES_GENERIC]
ALPHABET = '%"{}()[]<>:,=#^@!-+.x0123456789 \n\\abcdefloctensorf32i1dense0xFF'


def must_parse_or_fail_cleanly(text: str) -> None:
    """Only ParseError may escape; what parses prints, and that print is a fixpoint."""
    try:
        g = parse(text)
    except ParseError as e:
        assert e.line >= 1 and e.col >= 1
        return
    printed = print_graph(g, debuginfo=True)
    assert print_graph(parse(printed), debuginfo=True) == printed


@st.composite
def mutated(draw):
    """A seed text after 1-4 random edits (positions from a drawn Random: hypothesis' own
    integers lean towards 0, which would mostly break the first line)."""
    text = draw(st.sampled_from(SEEDS))
    rng = draw(st.randoms(use_true_random=False))
    for _ in range(rng.randint(1, 4)):
        i = rng.randint(0, len(text))
        kind = rng.choice(["delete", "insert", "replace", "truncate", "swap", "dup"])
        if kind == "delete":
            text = text[:i] + text[i + rng.randint(1, 8):]
        elif kind == "insert":
            text = text[:i] + "".join(rng.choices(ALPHABET, k=rng.randint(1, 6))) + text[i:]
        elif kind == "replace":
            text = text[:i] + rng.choice(ALPHABET) + text[i + 1:]
        elif kind == "truncate":
            text = text[:i]
        else:
            toks = text.split(" ")
            a, b = rng.randrange(len(toks)), rng.randrange(len(toks))
            if kind == "swap":
                toks[a], toks[b] = toks[b], toks[a]
            else:
                toks.insert(a, toks[b])
            text = " ".join(toks)
    return text


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_text_only_raises_parse_error(text):
    must_parse_or_fail_cleanly(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200) | st.text(ALPHABET, max_size=200))
def test_garbage_only_raises_parse_error(text):
    must_parse_or_fail_cleanly(text)


@pytest.mark.parametrize("text", [
    "[" * 5000, "func.func @f() {\n" + '"t.o"() ({' * 3000, "{" * 100000, "\"" + "\\" * 3,
    'func.func @f() {\n "t.o"() {v = dense<1.0> : tensor<99999999999999999999xf32>} : () -> ()',
    'func.func @f() {\n "t.o"() {v = dense<1.0> : tensor<999999999999999999x9999999999xf32>} : '
    '() -> ()\n}', 'func.func @f() {\n "t.o"() {v = ' + "9" * 5000 + "} : () -> ()\n}",
    'func.func @f() {\n "t.o"() {v = dense<[' + "9" * 400 + ".0]> : tensor<1xf32>} : () -> ()\n}",
    'func.func @f() {\n "t.o"() {v = 0x' + "F" * 40 + " : f64} : () -> ()\n}",
    'func.func @f() {\n "t.o"() {v = dense<"0x' + "F" * 7 + '"> : tensor<f32>} : () -> ()\n}',
    "#loc = loc(#loc)\nfunc.func @f() {\n} loc(#loc)\n", "loc(", '"\\FF"', "\ud800",
])
def test_hostile_inputs(text):
    must_parse_or_fail_cleanly(text)
