"""`ember opt model.onnx` and `ember train --model model.onnx`."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from ember.__main__ import main  # noqa: E402


def _save(path, dims, d_in=64):
    w = numpy_helper.from_array(np.full((d_in, 10), 0.01, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_opt_prints_the_imported_ir(tmp_path, capsys):
    assert main(["opt", _save(tmp_path / "m.onnx", [4, 64])]) == 0
    out = capsys.readouterr().out
    assert 'path = "initializers.w"' in out and "tensor<4x64xf32>" in out


def test_opt_names_a_symbolic_input_and_takes_its_shape(tmp_path, capsys):
    path = _save(tmp_path / "m.onnx", ["N", 64])
    assert main(["opt", path]) == 1
    assert "input 'x' has no static shape ([N, 64])" in capsys.readouterr().err
    assert main(["opt", path, "--input-shape", "x=2x64"]) == 0
    assert "tensor<2x64xf32>" in capsys.readouterr().out


def test_train_fine_tunes_an_imported_classifier(tmp_path, capsys):
    path = _save(tmp_path / "m.onnx", ["N", 64])
    assert main(["train", "--model", path, "--epochs", "1", "--no-progress"]) == 0
    assert "final test accuracy" in capsys.readouterr().out


def test_train_names_both_shapes_when_the_data_does_not_fit(tmp_path, capsys):
    path = _save(tmp_path / "m.onnx", ["N", 10], d_in=10)
    assert main(["train", "--model", path, "--epochs", "1", "--no-progress"]) == 1
    assert "input 'x': the model takes [N, 10], got [1438, 64]" in capsys.readouterr().err
