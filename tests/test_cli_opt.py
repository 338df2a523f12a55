"""`ember opt` as mlir-opt: stdin by default, `-o`, `--split-input-file`, `--list-passes`,
pass-name typos, errors with the source line and a caret, `--emit dot`."""

from __future__ import annotations

import io
import os
import re
import sys
import threading
from pathlib import Path

import pytest

from ember.__main__ import main
from ember.ir.parser import parse

SOFTMAX = """\
func.func @f(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = "nn.softmax"(%x) {axis = 1} : (tensor<2x3xf32>) -> tensor<2x3xf32>
  func.return %0 : tensor<2x3xf32>
}
"""
BAD = SOFTMAX.replace("@f", "@g").replace('"nn.softmax"(%x) {axis = 1}',
                                          '"ember.broadcast"(%x) {shape = [-1]}')
RELU = SOFTMAX.replace("@f", "@h").replace('"nn.softmax"(%x) {axis = 1}', '"ember.relu"(%x)')
LOSS = """\
func.func @loss(%x: tensor<4xf32>) -> tensor<f32> {
  %0 = "ember.param"() {id = "w", path = "w"} : () -> tensor<4xf32>
  %1 = "ember.mul"(%x, %0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %2 = "ember.exp"(%1) : (tensor<4xf32>) -> tensor<4xf32>
  %3 = "ember.reduce_sum"(%2) {axes = [0], keepdims = false} : (tensor<4xf32>) -> tensor<f32>
  func.return %3 : tensor<f32>
}
"""


def stdin(monkeypatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


def test_no_file_reads_stdin(capsys, monkeypatch):
    stdin(monkeypatch, SOFTMAX)
    assert main(["opt", "-p", "decompose"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("module {") and '"ember.exp"' in out and "nn.softmax" not in out


def test_output_file_is_written_and_stdout_stays_empty(capsys, tmp_path):
    src, dst = tmp_path / "in.mlir", tmp_path / "out" / "o.mlir"
    src.write_text(SOFTMAX)
    assert main(["opt", str(src), "-o", str(dst)]) == 0
    assert capsys.readouterr().out == ""
    assert dst.read_text().startswith("module {") and "nn.softmax" in dst.read_text()
    assert [p.name for p in dst.parent.iterdir()] == ["o.mlir"]  # no temporary left behind


def test_output_keeps_what_the_target_is(capsys, tmp_path):
    """-o replaces a regular file atomically, keeping its permissions; follows a symlink
    (the link stays a link); writes into a device or FIFO in place (never replacing it)."""
    src = tmp_path / "in.mlir"
    src.write_text(SOFTMAX)
    old = tmp_path / "old.mlir"
    old.write_text("")
    old.chmod(0o640)
    link = tmp_path / "link.mlir"
    link.symlink_to(old)
    assert main(["opt", str(src), "-o", str(link)]) == 0
    assert link.is_symlink() and "nn.softmax" in old.read_text()
    assert old.stat().st_mode & 0o777 == 0o640
    assert main(["opt", str(src), "-o", "/dev/null"]) == 0
    assert Path("/dev/null").is_char_device()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    read = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_text()))
    reader.start()
    assert main(["opt", str(src), "-o", str(fifo)]) == 0
    reader.join(30)
    assert fifo.is_fifo() and "nn.softmax" in read[0]


def test_a_new_output_gets_the_mode_the_umask_gives(tmp_path):
    """Not the temporary file's 0600: what open() would have made of it."""
    src = tmp_path / "in.mlir"
    src.write_text(SOFTMAX)
    old = os.umask(0o027)
    try:
        assert main(["opt", str(src), "-o", str(tmp_path / "new.mlir")]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "new.mlir").stat().st_mode & 0o777 == 0o640


def test_an_output_that_cannot_be_written_is_one_line(capsys, tmp_path):
    src = tmp_path / "in.mlir"
    src.write_text(SOFTMAX)
    assert main(["opt", str(src), "-o", "/proc/no/such/dir/o.mlir"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ember opt: error: cannot write /proc/no/such/dir/o.mlir: ")
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_an_endless_input_is_refused_once_past_the_limit(capsys, monkeypatch):
    import ember.__main__ as cli

    monkeypatch.setattr(cli, "MAX_TEXT", 1 << 20)
    assert main(["opt", "/dev/zero"]) == 1
    assert "larger than 1,048,576 bytes" in capsys.readouterr().err


def test_split_input_file_processes_each_chunk_and_reports_errors_per_chunk(capsys, tmp_path):
    src = tmp_path / "three.mlir"
    src.write_text(f"{SOFTMAX}// -----\n{BAD}// -----\n{RELU}")
    assert main(["opt", str(src), "--split-input-file"]) == 1
    out, err = capsys.readouterr()
    chunks = out.split("// -----\n")
    assert len(chunks) == 2 and "@f" in chunks[0] and "@h" in chunks[1]
    line = 1 + SOFTMAX.count("\n") + 1 + 1  # the broadcast, counted in the whole file
    message, quoted, caret = err.splitlines()
    assert message.startswith(f"{src}:{line}:3: error: op 'ember.broadcast'")
    assert quoted == src.read_text().splitlines()[line - 1] and caret == "  ^"
    # -o is written only when every chunk succeeded, so a failed run leaves no half file
    assert main(["opt", str(src), "--split-input-file", "-o", str(tmp_path / "o.mlir")]) == 1
    assert not (tmp_path / "o.mlir").exists()


def test_without_split_the_chunks_are_one_input(capsys, tmp_path):
    src = tmp_path / "two.mlir"
    src.write_text(f"{SOFTMAX}// -----\n{RELU}")
    assert main(["opt", str(src)]) == 1
    assert "expected exactly one func.func, got 2" in capsys.readouterr().err


def test_list_passes_and_help_show_every_pass_with_its_options(capsys):
    from ember.passes import PASSES

    with pytest.raises(SystemExit) as e:
        main(["opt", "--list-passes"])
    assert e.value.code == 0
    listed = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["opt", "--help"])
    helped = capsys.readouterr().out
    for name in PASSES:
        assert re.search(rf"^  {re.escape(name)}\b", listed, re.M), name
        assert re.search(rf"^  {re.escape(name)}\b", helped, re.M), name
    assert "decompose{linear=<str>}" in listed


@pytest.mark.parametrize("flags, fragment", [
    (["--print-ir-after", "autodif"], "--print-ir-after: unknown pass 'autodif'; did you mean "
                                      "'autodiff'?"),
    (["-p", "decompse"], "unknown pass 'decompse'; did you mean 'decompose' or 'recompute'?")])
def test_pass_name_typos_are_rejected_with_a_suggestion(capsys, tmp_path, flags, fragment):
    src = tmp_path / "in.mlir"
    src.write_text(SOFTMAX)
    assert main(["opt", str(src), *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ember opt: error: ") and fragment in err, err


def test_a_parse_error_quotes_its_line_with_a_caret(capsys, tmp_path):
    src = tmp_path / "in.mlir"
    src.write_text(SOFTMAX.replace("(%x) {axis", "(%y) {axis"))
    assert main(["opt", str(src)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{src}:2:21: error: use of undefined value '%y'",
        '  %0 = "nn.softmax"(%y) {axis = 1} : (tensor<2x3xf32>) -> tensor<2x3xf32>',
        " " * 20 + "^"]


def test_autodiff_after_fuse_says_to_reorder(capsys, monkeypatch):
    stdin(monkeypatch, LOSS)
    assert main(["opt", "-p", "fuse,autodiff"]) == 1
    err = capsys.readouterr().err
    assert "no gradient rule for op 'kernel." in err and "run autodiff before fuse" in err
    stdin(monkeypatch, LOSS)
    assert main(["opt", "-p", "autodiff,fuse"]) == 0


def test_emit_dot_has_a_node_per_op_and_an_edge_per_use(capsys, monkeypatch):
    stdin(monkeypatch, LOSS)
    assert main(["opt", "--emit", "dot"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith('digraph "loss" {') and dot.rstrip().endswith("}")
    nodes = re.findall(r"^  (op\d+) \[label=\"([^\"]*)\"", dot, re.M)
    graph = parse(LOSS)
    assert [label.split("\\n")[0] for _, label in nodes] == [
        "%0 = ember.param", "%1 = ember.mul", "%2 = ember.exp", "%3 = ember.reduce_sum",
        "func.return"]
    edges = re.findall(r"^  (\w+) -> (\w+);", dot, re.M)
    assert len(edges) == sum(len(op.operands) for op in graph.ops)
    assert ("arg0", "op1") in edges and ("op0", "op1") in edges and ("op3", "op4") in edges
    assert "[w]" in nodes[0][1]  # a param names its path

