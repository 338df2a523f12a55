"""Damaged and malformed ONNX input: one clear OnnxImportError each, nothing built."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import ember as em  # noqa: E402

OnnxImportError = em.onnx.OnnxImportError


def _model(nodes, inputs=("x",), outputs=("y",), initializers=(), opset=17):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [2, 3]) for i in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _linear():
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], initializers=[w])


def test_a_good_model_loads_and_runs(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_linear(), path)
    m = em.onnx.load(path)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(em.compile(m, x, backend="interpreter")(x), np.full((2, 4), 3.0))
    assert list(m.initializers) == ["w"] and m.initializers["w"].requires_grad


def test_a_truncated_file(tmp_path):
    data = _linear().SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxImportError, match="not a valid ONNX model"):
        em.onnx.load(path)


def test_random_bytes(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(OnnxImportError, match="not a valid ONNX model"):
        em.onnx.load(path)


def test_a_missing_file(tmp_path):
    with pytest.raises(OnnxImportError, match="cannot read"):
        em.onnx.load(tmp_path / "none.onnx")


def _external(location: str):
    model = _linear()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value=location)
    return model


def test_external_data_in_a_missing_file(tmp_path):
    onnx.save(_external("weights.bin"), tmp_path / "m.onnx")
    with pytest.raises(OnnxImportError, match="'w': external data file 'weights.bin' is missing"):
        em.onnx.load(tmp_path / "m.onnx")


def test_external_data_outside_the_models_folder(tmp_path):
    (tmp_path / "secret").write_bytes(np.ones(12, np.float32).tobytes())
    (tmp_path / "models").mkdir()
    onnx.save(_external("../secret"), tmp_path / "models" / "m.onnx")
    with pytest.raises(OnnxImportError, match="not a file inside the model's folder"):
        em.onnx.load(tmp_path / "models" / "m.onnx")


def test_external_data_is_read_from_the_models_folder(tmp_path):
    (tmp_path / "weights.bin").write_bytes(np.full(12, 2.0, np.float32).tobytes())
    onnx.save(_external("weights.bin"), tmp_path / "m.onnx")
    m = em.onnx.load(tmp_path / "m.onnx")
    np.testing.assert_array_equal(m.initializers["w"].val(), np.full((3, 4), 2.0))


def test_external_data_reads_only_its_tensors_bytes(tmp_path):
    """With no length given, the bytes its shape and type need (it read to the end of the
    file, however large); a length that disagrees with them is refused."""
    (tmp_path / "weights.bin").write_bytes(np.full(12, 2.0, np.float32).tobytes() + bytes(4096))
    onnx.save(_external("weights.bin"), tmp_path / "m.onnx")
    np.testing.assert_array_equal(em.onnx.load(tmp_path / "m.onnx").initializers["w"].val(),
                                  np.full((3, 4), 2.0))
    model = _external("weights.bin")
    model.graph.initializer[0].external_data.add(key="length", value="4144")
    onnx.save(model, tmp_path / "long.onnx")
    with pytest.raises(OnnxImportError, match="holds 4144 bytes, its shape \\[3, 4\\] and type "
                                              "need 48"):
        em.onnx.load(tmp_path / "long.onnx")


def _const(name: str, value) -> object:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(value), name))


def test_folding_a_huge_constant_is_refused_before_it_allocates():
    """181 bytes of ConstantOfShape asked for a 4 GiB array."""
    model = _model([_const("shape", np.array([1 << 16, 1 << 14], np.int64)),
                    helper.make_node("ConstantOfShape", ["shape"], ["big"]),
                    helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
                    helper.make_node("Add", ["x", "s"], ["y"])])
    with pytest.raises(OnnxImportError, match="ConstantOfShape\\): not folded at import: its "
                                              "result would have 1,073,741,824 elements"):
        em.compile(em.onnx.load(model), np.zeros((2, 3), np.float32), backend="interpreter")


def test_folding_a_loop_of_2_to_the_40_trips_is_refused():
    """A Loop over constants was run at import by ONNX's reference evaluator: for ever."""
    scalar = [helper.make_tensor_value_info(n, t, []) for n, t in
              (("i", TensorProto.INT64), ("c", TensorProto.BOOL), ("v", TensorProto.FLOAT))]
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c_out"]),
                              helper.make_node("Identity", ["v"], ["v_out"])], "body", scalar,
                             [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [])])
    model = _model([_const("trips", np.array(1 << 40, np.int64)), _const("go", np.array(True)),
                    _const("v0", np.array(0.0, np.float32)),
                    helper.make_node("Loop", ["trips", "go", "v0"], ["v"], body=body),
                    helper.make_node("Add", ["x", "v"], ["y"])])
    with pytest.raises(OnnxImportError, match="Loop\\): not folded at import: it would loop "
                                              "1099511627776 times"):
        em.compile(em.onnx.load(model), np.zeros((2, 3), np.float32), backend="interpreter")


def test_a_concat_of_inputs_of_different_ranks():
    model = _model([_const("row", np.ones(3, np.float32)),
                    helper.make_node("Concat", ["x", "row"], ["y"], axis=1)])
    with pytest.raises(OnnxImportError, match="Concat\\): its inputs have different ranks"):
        em.compile(em.onnx.load(model), np.zeros((2, 3), np.float32), backend="interpreter")


def test_an_undefined_input_name():
    model = _model([helper.make_node("Relu", ["nowhere"], ["y"], name="act")])
    with pytest.raises(OnnxImportError, match="node 0 'act' \\(Relu\\): input 'nowhere' is not "
                                              "defined"):
        em.onnx.load(model)


def test_a_cycle():
    model = _model([helper.make_node("Add", ["x", "b"], ["a"], name="first"),
                    helper.make_node("Relu", ["a"], ["b"], name="second"),
                    helper.make_node("Identity", ["a"], ["y"])])
    with pytest.raises(OnnxImportError, match="cycle: .*'first'.*'second'|cycle: .*'second'.*"
                                              "'first'"):
        em.onnx.load(model)


def test_unsupported_ops_are_listed_together():
    model = _model([helper.make_node("Selu", ["x"], ["a"], name="odd"),
                    helper.make_node("Relu", ["a"], ["b"]),
                    helper.make_node("Softmax", ["b"], ["c"], axis=1, name="fine"),
                    helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1, beta=2.0)])
    with pytest.raises(OnnxImportError) as e:
        em.onnx.load(model)
    assert e.value.problems == ["node 0 'odd' (Selu): op Selu is not supported",
                                "node 3 (LeakyRelu): attribute 'beta' is not supported"]
    assert "2 nodes are not supported" in str(e.value)


def test_a_shape_computed_from_the_inputs_is_reported():
    model = _model([helper.make_node("Cast", ["s"], ["si"], to=TensorProto.INT64),
                    helper.make_node("Reshape", ["x", "si"], ["y"])], inputs=("x", "s"))
    with pytest.raises(OnnxImportError, match="input 1 \\('si'\\) must be known at import"):
        em.onnx.load(model)


def test_an_old_opset_that_cannot_be_upgraded():
    """Older opsets are upgraded to 13 on import (tests/interop/test_onnx_constants.py);
    only a model onnx.version_converter cannot convert is refused."""
    with pytest.raises(OnnxImportError, match="opset 11 .* cannot upgrade it"):
        em.onnx.load(_model([helper.make_node("NoSuchOp", ["x"], ["y"])], opset=11))


def test_a_symbolic_input_needs_a_shape():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = em.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(OnnxImportError, match="input 'x' has no static shape \\(\\[N, 3\\]\\).*"
                                              "--input-shape x=1x3"):
        m.input_specs()
    assert m.input_specs({"x": (5, 3)})[0].shape == (5, 3)


def test_inputs_of_another_shape_are_refused():
    m = em.onnx.load(_linear())
    with pytest.raises(OnnxImportError, match="input 'x': the model takes \\[2, 3\\], got "
                                              "\\[2, 4\\]"):
        em.compile(m, np.ones((2, 4), np.float32), backend="interpreter")
    x = np.ones((5, 3), np.float32)  # the batch dim may differ: exporters fix it to theirs
    assert em.compile(m, x, backend="interpreter")(x).shape == (5, 4)
