"""`ember opt` on bad input: every error is one line on stderr (`file:line:col: error: ...`
where the text says where, then that source line and a caret under the column, as
mlir-opt prints it; else `file: error: ...`) and exit status 1, never a traceback; and a
huge splat constant goes through passes without being materialized."""

from __future__ import annotations

import io
import resource
import subprocess
import sys

import pytest

from ember.__main__ import main

GOOD = """\
func.func @f(%x: tensor<2x3xf32>, %l: tensor<2xi64>) -> tensor<2x3xf32> {
  %0 = "nn.softmax"(%x) {axis = 1} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  func.return %0 : tensor<2x3xf32>
}
"""


def opt(capsys, path, *flags: str) -> str:
    """`ember opt path flags`, which must fail: its one line of error (a located one is
    followed by the source line it names and a caret under its column)."""
    assert main(["opt", str(path), *flags]) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "Traceback" not in err and len(lines) in (1, 3), err
    if len(lines) == 3:
        col = int(lines[0].removeprefix(f"{path}:").split(":")[1])
        assert lines[2] == " " * (col - 1) + "^", err
    return lines[0]


@pytest.fixture
def mlir(tmp_path):
    def write(data: str | bytes, name: str = "in.mlir"):
        p = tmp_path / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        return p
    return write


def test_non_utf8_file_is_an_error_at_its_byte(capsys, mlir):
    p = mlir(GOOD.replace("axis = 1", 'axis = 1, s = "\xff"').encode("latin-1"))
    assert opt(capsys, p) == f"{p}:2:41: error: expected UTF-8 text, got byte 0xFF"


def test_non_utf8_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\x80func.func")))
    assert opt(capsys, "-") == "<stdin>:1:1: error: expected UTF-8 text, got byte 0x80"


@pytest.mark.parametrize("emit, backend", [("llvm", "cpu"), ("cuda", "cuda")])
def test_emit_of_undecomposed_ir_names_the_op(capsys, mlir, emit, backend):
    p = mlir(GOOD)
    err = opt(capsys, p, "--emit", emit)
    assert err.startswith(f"{p}: error: the {backend} backend has no kernel for 'nn.softmax'")
    assert "decompose" in err


def test_emit_llvm_after_decompose_works(capsys, mlir):
    assert main(["opt", str(mlir(GOOD)), "-p", "decompose", "--emit", "llvm"]) == 0
    assert "define" in capsys.readouterr().out


def test_verify_errors_carry_file_line_col(capsys, mlir):
    p = mlir(GOOD.replace('"nn.softmax"(%x) {axis = 1}', '"ember.broadcast"(%x) {shape = [-1]}'))
    assert opt(capsys, p) == (f"{p}:2:3: error: op 'ember.broadcast': ember.broadcast attribute"
                              " 'shape' must be a list of dimensions >= 0, got [-1]")


@pytest.mark.parametrize("attr, fragment", [
    ("ember.label_args = [[1, 2, 3, 4]]", "'ember.label_args' must be a list of [argument, "
     "classes]"),
    ("ember.label_args = [[7, 2]]", "7 is not an argument index of @f, which has 2 arguments"),
    ("ember.label_args = [[0, 2]]", "argument 0 of @f is tensor<2x3xf32>, not an integer tensor"),
    ("ember.finite_args = [1]", "argument 1 of @f is tensor<2xi64>, not a float tensor"),
    ('ember.finite_args = "all"', "'ember.finite_args' must be a list of argument indices"),
])
@pytest.mark.parametrize("emit", ["mlir", "llvm"])
def test_malformed_input_checks(capsys, mlir, attr, fragment, emit):
    p = mlir(GOOD.replace(" {\n", f" attributes {{{attr}}} {{\n", 1))
    err = opt(capsys, p, "-p", "decompose", "--emit", emit)
    assert err.startswith(f"{p}:1:1: error: graph attribute ") and fragment in err, err


def test_parse_error(capsys, mlir):
    p = mlir(GOOD.replace("%x) {axis", "%y) {axis"))
    assert opt(capsys, p) == f"{p}:2:21: error: use of undefined value '%y'"


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_unreadable_file(capsys, tmp_path, what):
    p = tmp_path / "nothing.mlir" if what == "missing" else tmp_path
    assert opt(capsys, p).startswith(f"{p}: error: [Errno ")


BIG_SPLATS = """\
func.func @f() -> (tensor<100000x100000xf32>, tensor<100000x100000xf32>) {
  %0 = "ember.constant"() {value = dense<1.0> : tensor<100000x100000xf32>} : () -> tensor<100000x100000xf32>
  %1 = "ember.constant"() {value = dense<1.0> : tensor<100000x100000xf32>} : () -> tensor<100000x100000xf32>
  %2 = "ember.mul"(%0, %1) : (tensor<100000x100000xf32>, tensor<100000x100000xf32>) -> tensor<100000x100000xf32>
  %3 = "ember.reduce_sum"(%2) {axes = [0, 1], keepdims = false} : (tensor<100000x100000xf32>) -> tensor<f32>
  %4 = "ember.broadcast"(%3) {shape = [100000, 100000]} : (tensor<f32>) -> tensor<100000x100000xf32>
  func.return %2, %4 : tensor<100000x100000xf32>, tensor<100000x100000xf32>
}
"""  # noqa: E501


def _two_gib() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_huge_splats_are_never_materialized(mlir):
    """40 GB of elements each: parsing, verifying, cse, canonicalize and printing must all
    work on the splat's one element (under a 2 GiB address-space limit)."""
    r = subprocess.run([sys.executable, "-m", "ember", "opt", str(mlir(BIG_SPLATS)),
                        "-p", "cse,canonicalize", "--verify-each"],
                       capture_output=True, text=True, preexec_fn=_two_gib, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.count('"ember.constant"') == 1  # merged by cse
    assert "ember.mul" not in out  # x * 1 is x
    assert '"ember.reduce_sum"' in out  # too big an operand to fold


def test_a_backend_that_cannot_generate_code_is_one_line(capsys, mlir, monkeypatch):
    """KernelCompileError is a backend bug, but `ember opt` still reports it as one line."""
    from ember.backends import cpu
    from ember.backends.cpu import KernelCompileError

    def fail(graph):
        raise KernelCompileError("kernel.fused #3: no vector form")

    monkeypatch.setattr(cpu, "emit_llvm", fail)
    path = mlir(GOOD)
    err = opt(capsys, path, "-p", "decompose", "--emit", "llvm")
    assert err == f"{path}: error: kernel.fused #3: no vector form"
