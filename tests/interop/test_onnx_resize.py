"""ONNX Resize (interop/onnx_ops_resize.py) and MaxPool with dilations on import, and
`nn.functional.interpolate` on export.

Resize nodes built with onnx.helper, for each mode, coordinate_transformation_mode and
nearest_mode, by scales (up, down, non-integer) or sizes, with opset 11's roi input and
opset 18's axes, against onnxruntime (nearest: the pixels the exact coordinates round to);
ONNX's own node tests of Resize; the refusals, by name. A torch.nn.Upsample /
F.interpolate model exported by torch (TorchScript exporter, opset 17) imports and matches
torch, with torch's gradients. MaxPool with dilations against onnxruntime, and its gradient
against torch's max_pool2d(dilation=). A model using interpolate saved by `em.onnx.save`
runs in onnxruntime as in ember."""

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from torch_onnx import torch_export  # noqa: E402

import ember as em  # noqa: E402
from ember import nn  # noqa: E402

OnnxImportError = em.onnx.OnnxImportError
COORDINATES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
               "half_pixel_symmetric"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SHAPE = (2, 3, 5, 7)
RESIZES = [  # (scales, sizes) of the last two axes
    ((2.0, 2.0), None), ((1.5, 0.6), None), ((0.6, 1.5), None), ((0.3, 2.5), None),
    ((1.0, 1.7), None), (None, (8, 9)), (None, (3, 4)), (None, (1, 13)), (None, (5, 7)),
]


def resize_model(attrs: dict, scales=None, sizes=None, shape=SHAPE, opset: int = 19,
                 inputs: list[str] | None = None, dtype=TensorProto.FLOAT) -> bytes:
    """One Resize of graph input x; scales (float32) and sizes (int64) as initializers, roi
    left out (opset 11 and 12 need it, empty)."""
    inits = []
    if scales is not None:
        inits.append(numpy_helper.from_array(np.asarray(scales, np.float32), "scales"))
    if sizes is not None:
        inits.append(numpy_helper.from_array(np.asarray(sizes, np.int64), "sizes"))
    if inputs is None:
        roi = "roi" if opset < 13 else ""
        if roi:
            inits.append(numpy_helper.from_array(np.zeros(0, np.float32), "roi"))
        if sizes is None:
            inputs = ["x", roi, "scales"]
        else:
            inputs = ["x", roi, "scales" if scales is not None else "", "sizes"]
            if opset < 13 and scales is None:
                inits.append(numpy_helper.from_array(np.zeros(0, np.float32), "empty"))
                inputs[2] = "empty"
    graph = helper.make_graph(
        [helper.make_node("Resize", inputs, ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]
                             ).SerializeToString()


def _ort(m: bytes, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _ember(m: bytes, x: np.ndarray, backend: str = "interpreter") -> np.ndarray:
    return em.compile(em.onnx.load(m), x, backend=backend)(x)


def _x(shape=SHAPE, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def _full(pair, fill):
    return None if pair is None else [fill, fill, *pair]


def _agree(m: bytes, x: np.ndarray, backend: str = "interpreter", what=""):
    got, want = _ember(m, x, backend), _ort(m, x)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(what))


def _exact(coordinate: str, i: int, n: int, out: int, scale: Fraction) -> Fraction:
    """The source coordinate of output position i, in exact arithmetic."""
    half = Fraction(1, 2)
    if coordinate == "asymmetric":
        return i / scale
    if coordinate == "align_corners":
        return Fraction(0) if out == 1 else Fraction(i * (n - 1), out - 1)
    if coordinate == "pytorch_half_pixel" and out == 1:
        return Fraction(0)
    c = (i + half) / scale - half
    if coordinate == "half_pixel_symmetric":
        c += Fraction(n, 2) * (1 - out / (scale * n))
    return c


def _allowed(coordinate: str, nearest: str, n: int, out: int, scale: Fraction) -> list[set]:
    """Per output position, the input positions a right nearest Resize picks: the one its
    rounding of the exact coordinate gives, or either side where that coordinate is within
    1e-5 of a rounding boundary (there the float32 arithmetic decides, and onnxruntime's
    own builds differ)."""
    if scale == 1:
        return [{i} for i in range(out)]
    sets = []
    for i in range(out):
        c = _exact(coordinate, i, n, out, scale)
        lo = math.floor(c)
        frac = c - lo
        if nearest in ("floor", "ceil"):
            pick = {lo if nearest == "floor" or frac == 0 else lo + 1}
            if min(frac, 1 - frac) < 1e-5:
                pick = {round(c) - 1, round(c)} if nearest == "floor" else {round(c), round(c) + 1}
        else:
            pick = {lo if frac < Fraction(1, 2) or (frac == Fraction(1, 2) and nearest ==
                                                    "round_prefer_floor") else lo + 1}
            if abs(frac - Fraction(1, 2)) < 1e-5:
                pick = {lo, lo + 1}
        sets.append({min(max(p, 0), n - 1) for p in pick})
    return sets


@pytest.mark.parametrize("coordinate", COORDINATES)
@pytest.mark.parametrize("nearest", NEAREST)
def test_nearest_picks_the_right_pixels(coordinate, nearest):
    """Every output element is the input element the exact coordinate rounds to, as in
    onnxruntime (at ties, where float32 decides, either neighbour), at every scale."""
    h, w = SHAPE[2:]
    x = np.arange(h * w, dtype=np.float32).reshape(1, 1, h, w)
    for scales, sizes in RESIZES:
        attrs = dict(mode="nearest", coordinate_transformation_mode=coordinate,
                     nearest_mode=nearest)
        m = resize_model(attrs, _full(scales, 1.0), sizes and [1, 1, *sizes],
                         shape=(1, 1, h, w))
        want = []
        for k, n in enumerate((h, w)):
            if sizes is None:
                s = Fraction(float(np.float32(scales[k])))
                out = int(np.floor(np.float32(scales[k]) * np.float32(n)))
            else:
                out = sizes[k]
                s = Fraction(out, n)
            want.append(_allowed(coordinate, nearest, n, out, s))
        for name, got in (("ember", _ember(m, x)), ("onnxruntime", _ort(m, x))):
            rows, cols = np.divmod(got[0, 0].astype(int), w)
            assert rows.shape == (len(want[0]), len(want[1])), (name, scales, sizes)
            for p, q in np.ndindex(rows.shape):
                assert rows[p, q] in want[0][p] and cols[p, q] in want[1][q], (
                    name, scales, sizes, (p, q), (rows[p, q], cols[p, q]), want[0][p],
                    want[1][q])


@pytest.mark.parametrize("coordinate", COORDINATES)
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_linear_matches_onnxruntime(coordinate, backend):
    x = _x()
    for scales, sizes in RESIZES:
        m = resize_model(dict(mode="linear", coordinate_transformation_mode=coordinate),
                         _full(scales, 1.0), sizes and [SHAPE[0], SHAPE[1], *sizes])
        _agree(m, x, backend, what=(scales, sizes))


def test_the_default_attributes_and_a_3d_and_5d_input():
    for shape, scales in [((2, 3, 9), [1, 1, 1.5]), ((1, 2, 3, 4, 5), [1, 1, 1.5, 2, 0.6])]:
        x = _x(shape)
        for attrs in ({}, dict(mode="linear")):
            _agree(resize_model(attrs, scales, shape=shape), x, what=(shape, attrs))


def test_resizing_the_batch_and_channel_axes_too():
    """(onnxruntime's linear mode resizes at most the two middle or the two last axes)"""
    x = _x()
    _agree(resize_model({}, [2.0, 0.5, 1.5, 0.6]), x)
    _agree(resize_model(dict(mode="linear", coordinate_transformation_mode="align_corners"),
                        [1, 2.0, 0.6, 1]), x)


def test_opset_11_and_18_forms():
    """Opset 11's roi input (upgraded to 13 on import) and tf_half_pixel_for_nn; opset 18's
    axes."""
    x = _x()
    for scales in ([1, 1, 2.0, 2.0], [1, 1, 1.5, 0.7]):
        _agree(resize_model(dict(mode="linear", coordinate_transformation_mode="asymmetric"),
                            scales, opset=11), x, what=(11, scales))
        _agree(resize_model(dict(coordinate_transformation_mode="tf_half_pixel_for_nn"),
                            scales, opset=11), x, what=("tf_half_pixel_for_nn", scales))
    _agree(resize_model(dict(mode="linear"), sizes=[2, 3, 4, 11], opset=11), x, what="sizes")
    for axes, scales, sizes in [([2, 3], [1.5, 0.7], None), ([3, 2], [1.5, 0.7], None),
                                ([-1], None, [11])]:
        m = resize_model(dict(mode="linear", axes=axes), scales, sizes, opset=18)
        _agree(m, x, what=axes)


def test_integer_input_nearest():
    x = np.arange(2 * 3 * 5 * 7, dtype=np.int32).reshape(SHAPE)
    m = resize_model({}, [1, 1, 1.5, 0.7], dtype=TensorProto.INT32)
    np.testing.assert_array_equal(_ember(m, x, "cpu"), _ort(m, x))


# ONNX's reference computes align_corners' ratio with the unrounded output length
# (scale * length); onnxruntime, torch and ember with the output's length
ONNX_REFERENCE_DIFFERS = {"test_resize_downsample_scales_linear_align_corners"}


def test_onnx_node_tests_of_resize():
    from onnx.backend.test.case import node

    from ember.interop.onnx_ops import RULES

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in node.collect_testcases() if len(c.model.graph.node) == 1
                 and c.model.graph.node[0].op_type == "Resize"
                 and not c.name.endswith("_expanded")]
    ran = 0
    for case in cases:
        n = case.model.graph.node[0]
        inputs, (want,) = case.data_sets[0]
        given = {i.name: numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto)
                 else np.asarray(v) for i, v in zip(case.model.graph.input, inputs)}
        values = dict(given)
        bound = {name: values.pop(name) for k, name in enumerate(n.input)
                 if k in RULES["Resize"].static and name in values}
        try:
            m = em.onnx.load(case.model, constants=bound)
        except OnnxImportError as e:
            assert any(w in str(e) for w in ("cubic", "tf_crop_and_resize", "antialias",
                                             "keep_aspect_ratio_policy", "exclude_outside")), e
            continue
        got = em.compile(m, *values.values(), backend="cpu")(*values.values())
        want = numpy_helper.to_array(want) if isinstance(want, onnx.TensorProto) else want
        if case.name in ONNX_REFERENCE_DIFFERS:
            session = ort.InferenceSession(case.model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
            np.testing.assert_allclose(got, session.run(None, given)[0], rtol=1e-6)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=case.name)
        ran += 1
    assert ran >= 18


@pytest.mark.parametrize("attrs, message", [
    (dict(mode="cubic"), r"mode='cubic' is not supported \(nearest and linear are\)"),
    (dict(coordinate_transformation_mode="tf_crop_and_resize"),
     r"coordinate_transformation_mode='tf_crop_and_resize' is not supported"),
    (dict(antialias=1, mode="linear"), r"antialias=1 is not supported \(only 0\)"),
    (dict(exclude_outside=1), r"exclude_outside=1 is not supported"),
    (dict(keep_aspect_ratio_policy="not_larger"),
     r"keep_aspect_ratio_policy='not_larger' is not supported \(only 'stretch'\)"),
    (dict(nearest_mode="nearest"), r"nearest_mode='nearest' is not supported"),
])
def test_what_is_not_supported_is_refused_by_name(attrs, message):
    with pytest.raises(OnnxImportError, match=r"node 0 \(Resize\): " + message):
        em.onnx.load(resize_model(attrs, [1, 1, 2.0, 2.0]))


def test_malformed_resizes_are_named():
    x = _x()
    with pytest.raises(OnnxImportError, match="exactly one of its scales and sizes"):
        _ember(resize_model({}, [1, 1, 2.0, 2.0], [2, 3, 10, 14]), x)
    with pytest.raises(OnnxImportError, match=r"scales \[2.0, 2.0\] must give one value for "
                                              r"each of the 4 axes"):
        _ember(resize_model({}, [2.0, 2.0]), x)
    with pytest.raises(OnnxImportError, match="mode 'linear' needs a float input, got i64"):
        m = resize_model(dict(mode="linear"), [1, 1, 2.0, 2.0], dtype=TensorProto.INT64)
        _ember(m, x.astype(np.int64))


# -- a torch export -------------------------------------------------------------------------

class Net(torch.nn.Module):
    """A convolution, then each kind of resize torch exports as Resize (opset 17)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.up = torch.nn.Upsample(scale_factor=2, mode="nearest")
        self.conv2 = torch.nn.Conv2d(4, 2, 1)

    def forward(self, x):
        h = self.conv(x)
        a = self.up(h)
        b = torch.nn.functional.interpolate(h, size=(10, 14), mode="bilinear")
        c = torch.nn.functional.interpolate(h, scale_factor=1.5, mode="bilinear",
                                            align_corners=True)
        d = torch.nn.functional.interpolate(h, scale_factor=0.6, mode="nearest")
        e = torch.nn.functional.interpolate(h, size=(7, 9), mode="bilinear")
        return (self.conv2(a + b).sum((2, 3)) + c.mean((2, 3)).sum(1, keepdim=True)
                + d.amax((2, 3)).sum(1, keepdim=True) + e.sum((2, 3)).sum(1, keepdim=True))


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_a_torch_export_matches_torch_and_onnxruntime(backend):
    torch.manual_seed(0)
    model, x = Net().eval(), _x((2, 3, 5, 7))
    b = torch_export(model, x)
    assert sum(n.op_type == "Resize" for n in onnx.load_from_string(b).graph.node) == 5
    got = _ember(b, x, backend)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, _ort(b, x), rtol=1e-5, atol=1e-5)


def test_gradients_of_the_import_are_torchs():
    torch.manual_seed(0)
    model, x = Net(), _x((2, 3, 5, 7))
    w = np.random.default_rng(1).standard_normal((2, 2)).astype(np.float32)
    m = em.onnx.load(torch_export(model, x))
    grads = em.compile_grad(m, lambda out, y: (out * y).sum(), backend="cpu")(x, w)
    (model(torch.from_numpy(x)) * torch.from_numpy(w)).sum().backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[m.initializers[name]], p.grad.numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=name)


# -- MaxPool with dilations ------------------------------------------------------------------

def maxpool_model(attrs: dict, shape) -> bytes:
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                             ).SerializeToString()


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[2, 2], dilations=[2, 2]),
    dict(kernel_shape=[3, 3], dilations=[2, 1], strides=[1, 2]),
    dict(kernel_shape=[3, 2], dilations=[2, 3], pads=[2, 1, 2, 1]),
    dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[1, 0, 2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], dilations=[2, 2], strides=[2, 2], ceil_mode=1),
    dict(kernel_shape=[3], dilations=[2], strides=[2]),
])
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_maxpool_with_dilations_matches_onnxruntime(attrs, backend):
    shape = (2, 3, 11) if len(attrs["kernel_shape"]) == 1 else (2, 3, 9, 10)
    m, x = maxpool_model(attrs, shape), _x(shape)
    _agree(m, x, backend, what=attrs)


def test_maxpool_same_upper_pads_for_the_dilated_kernel():
    """ONNX's SAME_UPPER keeps the input's size, the dilated kernel's (k - 1) * d padding
    split with the extra one after (onnxruntime pads for the undilated kernel: 7x8 here)."""
    x = _x((2, 3, 9, 10))
    m = maxpool_model(dict(kernel_shape=[2, 2], dilations=[3, 3], auto_pad="SAME_UPPER"),
                      x.shape)
    padded = torch.nn.functional.pad(torch.from_numpy(x), (1, 2, 1, 2), value=-np.inf)
    want = torch.nn.functional.max_pool2d(padded, 2, stride=1, dilation=3).numpy()
    assert want.shape == x.shape
    np.testing.assert_array_equal(_ember(m, x, "cpu"), want)


def test_maxpool_with_dilations_has_torchs_gradient():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3),
                                torch.nn.MaxPool2d(3, stride=2, padding=1, dilation=2),
                                torch.nn.Flatten())
    x = _x((2, 3, 11, 12))
    b = torch_export(model, x)
    node = next(n for n in onnx.load_from_string(b).graph.node if n.op_type == "MaxPool")
    assert list(helper.get_attribute_value(
        next(a for a in node.attribute if a.name == "dilations"))) == [2, 2]
    m = em.onnx.load(b)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_ember(b, x, "cpu"), want, rtol=1e-5, atol=1e-6)
    w = np.random.default_rng(1).standard_normal(want.shape).astype(np.float32)
    grads = em.compile_grad(m, lambda out, y: (out * y).sum(), backend="cpu")(x, w)
    (model(torch.from_numpy(x)) * torch.from_numpy(w)).sum().backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[m.initializers[name]], p.grad.numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=name)


# -- export -----------------------------------------------------------------------------------

class Resizes(nn.Module):
    def forward(self, x):
        F = nn.functional
        return (F.interpolate(x, scale_factor=1.5, mode="bilinear")[..., :6, :6]
                + F.interpolate(x, size=(6, 6))
                + F.interpolate(x, scale_factor=1.3, mode="bilinear", align_corners=True)[
                    ..., :6, :6])


def test_interpolate_exports_and_runs_in_onnxruntime(tmp_path):
    x = _x((2, 3, 5, 7))
    path = tmp_path / "resize.onnx"
    em.onnx.save(Resizes(), str(path), x)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert "Gather" in ops and "Resize" not in ops, ops
    want = em.compile(Resizes(), x, backend="cpu")(x)
    np.testing.assert_allclose(_ort(path.read_bytes(), x), want, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        t = torch.from_numpy(x)
        ref = (torch.nn.functional.interpolate(t, scale_factor=1.5, mode="bilinear")[..., :6, :6]
               + torch.nn.functional.interpolate(t, size=(6, 6))
               + torch.nn.functional.interpolate(t, scale_factor=1.3, mode="bilinear",
                                                 align_corners=True)[..., :6, :6])
    np.testing.assert_allclose(want, ref.numpy(), rtol=1e-5, atol=1e-6)


def test_an_opset_10_upsample_is_refused_not_misread():
    """onnx.version_converter leaves opset 9/10's asymmetric coordinates implicit, which
    opset 13 reads as half_pixel: refused, naming the way out."""
    node = helper.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor("s", TensorProto.FLOAT, [4], [1, 1, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    with pytest.raises(em.onnx.OnnxImportError, match="export it again at opset 11"):
        em.onnx.load(model.SerializeToString())
