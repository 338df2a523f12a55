"""3-d convolutions, pools and batch norm through ONNX both ways: an ember 3-d model exports
(its compositions as core ONNX ops, the batch dim symbolic) and runs in onnxruntime as in
ember; a PyTorch 3-d model exported by torch.onnx, and single Conv, ConvTranspose, MaxPool,
AveragePool, GlobalAveragePool, GlobalMaxPool and BatchNormalization nodes on 5-d input
(uneven and auto pads, dilations, ceil_mode, output_shape), import and compute as
onnxruntime does."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import ember as em  # noqa: E402
from ember import nn  # noqa: E402

F = nn.functional
helper, TensorProto = onnx.helper, onnx.TensorProto
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _ort(model, *xs):
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip([i.name for i in session.get_inputs()], xs)))


class Net3d(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 4, 3, padding="same", groups=2)
        self.bn = nn.BatchNorm3d(4)
        self.pool = nn.MaxPool3d(2, ceil_mode=True)
        self.up = nn.ConvTranspose3d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.avg = nn.AvgPool3d(3, 2, 1, count_include_pad=False)
        self.amax = nn.AdaptiveMaxPool3d((2, 3, 2))
        self.fc = nn.Linear(3 * 12, 5)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        x = self.avg(self.up(x))
        return self.fc(self.amax(x).flatten(1)), F.adaptive_avg_pool3d(x, 1)


def test_an_ember_3d_model_exports_and_runs_in_onnxruntime(tmp_path):
    em.seed(0)
    model = Net3d()
    model.bn.running_mean.set_value(np.array([0.2, -0.3, 0.1, 0.0], np.float32))
    model.bn.running_var.set_value(np.array([1.5, 0.5, 2.0, 1.0], np.float32))
    path = tmp_path / "net3d.onnx"
    em.onnx.save(model, str(path), em.TensorSpec(("N", 2, 5, 6, 7)))
    for n in (1, 3):
        x = _x(n, 2, 5, 6, 7, seed=n)
        want = em.compile(model, x, backend="cpu")(x)
        for g, w in zip(_ort(str(path), x), want, strict=True):
            np.testing.assert_allclose(g, w, **TOL)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_a_torch_3d_model_imports_and_matches_onnxruntime(backend):
    torch = pytest.importorskip("torch")
    from torch_onnx import torch_export

    tnn = torch.nn
    torch.manual_seed(0)
    model = tnn.Sequential(
        tnn.Conv3d(2, 4, (3, 2, 3), stride=(1, 2, 1), padding=(1, 0, 1), dilation=(2, 1, 1)),
        tnn.BatchNorm3d(4), tnn.ReLU(),
        tnn.MaxPool3d(2, stride=1, padding=1, dilation=(1, 2, 1), ceil_mode=True),
        tnn.ConvTranspose3d(4, 2, 3, stride=(2, 1, 2), padding=1, output_padding=(1, 0, 1)),
        tnn.AvgPool3d(2, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
        tnn.AdaptiveAvgPool3d(1)).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    x = _x(2, 2, 5, 8, 6)
    onnx_bytes = torch_export(model, x)
    ops = {n.op_type for n in onnx.load_from_string(onnx_bytes).graph.node}
    assert {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool"} <= ops
    got = em.compile(em.onnx.load(onnx_bytes), x, backend=backend)(x)
    np.testing.assert_allclose(got, _ort(onnx_bytes, x)[0], **TOL)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(torch.from_numpy(x)).numpy(), **TOL)


def _node(op, x_shape, *params, **attrs) -> bytes:
    """One `op` node on x of `x_shape`, its other inputs initializers (the arrays
    `params`)."""
    names = [f"p{i}" for i in range(len(params))]
    graph = helper.make_graph(
        [helper.make_node(op, ["x", *names], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(p, n) for p, n in zip(params, names)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                             ).SerializeToString()


NODES = {
    "Conv uneven pads groups": ("Conv", [_x(4, 1, 2, 3, 2), _x(4)],
                                dict(pads=[1, 0, 2, 0, 1, 1], strides=[2, 1, 1], group=2)),
    "Conv SAME_UPPER": ("Conv", [_x(3, 2, 3, 2, 2)],
                                dict(auto_pad="SAME_UPPER", strides=[1, 2, 2],
                                     dilations=[1, 1, 1])),
    "ConvTranspose output_shape": ("ConvTranspose", [_x(2, 3, 3, 2, 3), _x(3)],
                                   dict(strides=[2, 2, 1], output_shape=[10, 12, 7])),
    "ConvTranspose pads output_padding": ("ConvTranspose", [_x(2, 2, 2, 3, 3)],
                                          dict(strides=[3, 2, 2], pads=[1, 0, 0, 2, 1, 1],
                                               output_padding=[2, 1, 0])),
    "MaxPool SAME_LOWER": ("MaxPool", [], dict(kernel_shape=[2, 3, 2], auto_pad="SAME_LOWER",
                                               strides=[1, 2, 2])),
    "MaxPool dilations": ("MaxPool", [], dict(kernel_shape=[2, 3, 2], strides=[1, 2, 1],
                                              pads=[1, 1, 0, 1, 1, 1], dilations=[2, 1, 2])),
    "MaxPool uneven pads ceil": ("MaxPool", [], dict(kernel_shape=[3, 3, 2], strides=[2, 2, 2],
                                                     pads=[0, 1, 1, 2, 1, 0], ceil_mode=1)),
    "AveragePool count_include_pad ceil": ("AveragePool", [],
                                           dict(kernel_shape=[3, 2, 3], strides=[2, 2, 2],
                                                pads=[1, 1, 0, 1, 0, 1], ceil_mode=1,
                                                count_include_pad=1)),
    "AveragePool exclude pad": ("AveragePool", [], dict(kernel_shape=[2, 3, 3],
                                                        pads=[1, 1, 1, 0, 1, 1])),
    "GlobalAveragePool": ("GlobalAveragePool", [], {}),
    "GlobalMaxPool": ("GlobalMaxPool", [], {}),
    "BatchNormalization": ("BatchNormalization",
                           [_x(2, seed=1), _x(2, seed=2), _x(2, seed=3),
                            np.array([0.5, 2.0], np.float32)], dict(epsilon=1e-3)),
}


@pytest.mark.parametrize("name", NODES)
def test_single_5d_nodes_match_onnxruntime(name):
    op, params, attrs = NODES[name]
    x = _x(2, 2, 5, 6, 5, seed=4)
    model = _node(op, list(x.shape), *params, **attrs)
    got = em.compile(em.onnx.load(model), x, backend="interpreter")(x)
    want = _ort(model, x)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, **TOL)
