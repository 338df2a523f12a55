"""Symbolic dims both ways: `em.onnx.save(model, path, em.TensorSpec(("N", ...)))` writes a
file that onnxruntime runs at any batch (and sequence) size, its shape numbers computed from
`Shape` of the input; a graph whose numbers do not follow the sizes as ONNX can is refused
by name; an imported file's symbolic dims take any size, and a fixed batch another size
where the graph runs it (else the error says to export with a symbolic batch)."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from ember import nn
from ember.interop.onnx_errors import OnnxImportError
from ember.interop.onnx_export import FIT_SIZES, OnnxExportError, _fit
from ember.interop.onnx_export_ops import Poly
from ember.runtime import models

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from ember.__main__ import main  # noqa: E402

F = nn.functional
TOL = {"atol": 1e-5, "rtol": 1e-5}


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(self.norm(F.gelu(self.fc1(x))))


class SmallCnn(nn.Module):
    """conv - relu - max pool - flatten (a reshape to [N, 128]) - linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv(x)))
        return self.head(x.reshape(x.shape[0], -1))


class Block(nn.Module):
    """Pre-norm causal self-attention and a feed-forward: reshapes to [N*T, d], a causal
    mask of [T, T], head splits to [N, T, h, d/h]."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiHeadAttention(d, 4, causal=True)
        self.ln2 = nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x)), "tanh"))


class Positions(nn.Module):
    """A learned position per step: an embedding of np.arange(T), a constant of shape [T]."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Embedding(32, 8)

    def forward(self, x):
        return x + self.pos(np.arange(x.shape[1]))


class MeanOverBatch(nn.Module):
    """Divides by the batch size it reads from x.shape: a constant that follows N."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).sum(0) / x.shape[0]


CASES = {  # name: (model, spec, the output's dims, shapes where onnxruntime must match ember)
    "mlp": (Mlp, ("N", 16), ["N", 10], [(1, 16), (7, 16), (64, 16)]),
    "cnn": (SmallCnn, ("N", 3, 8, 8), ["N", 10], [(1, 3, 8, 8), (7, 3, 8, 8), (64, 3, 8, 8)]),
    "builtin_cnn": (models.Cnn, ("N", 1, 8, 8), ["N", 10],
                    [(1, 1, 8, 8), (7, 1, 8, 8), (64, 1, 8, 8)]),
    "block": (Block, ("N", 5, 16), ["N", 5, 16], [(1, 5, 16), (7, 5, 16), (64, 5, 16)]),
    "block_sequence": (Block, ("N", "T", 16), ["N", "T", 16],
                       [(1, 1, 16), (7, 3, 16), (64, 9, 16), (2, 24, 16)]),
    "positions": (Positions, ("N", "T", 8), ["N", "T", 8], [(1, 1, 8), (7, 3, 8), (64, 20, 8)]),
    "mean_over_batch": (MeanOverBatch, ("N", 4), [3], [(1, 4), (7, 4), (64, 4)]),
}


def _x(shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(path, *xs) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), xs)})


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    em.seed(0)
    make, spec, dims, shapes = CASES[request.param]
    model = make()
    path = tmp_path_factory.mktemp(request.param) / "model.onnx"
    assert em.onnx.save(model, str(path), em.TensorSpec(spec)) == str(path)
    return model, spec, dims, shapes, path


def test_onnxruntime_matches_ember_at_every_size(exported):
    model, _, _, shapes, path = exported
    for k, shape in enumerate(shapes):
        x = _x(shape, k)
        (got,) = _run(path, x)
        want = em.compile(model, x, backend="interpreter")(x)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, **TOL)


def test_the_file_names_the_symbolic_dims_and_reads_them_from_the_input(exported):
    _, spec, dims, _, path = exported
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert _dims(proto.graph.input[0]) == list(spec)
    assert _dims(proto.graph.output[0]) == dims
    for n in proto.graph.node:
        if n.op_type == "Shape":
            assert list(n.input) == [proto.graph.input[0].name]


def test_a_reshape_to_n_times_t_is_computed_at_run_time(tmp_path):
    em.seed(0)
    path = tmp_path / "block.onnx"
    em.onnx.save(Block(), str(path), em.TensorSpec(("N", "T", 16)))
    proto = onnx.load(str(path))
    constants = {n.output[0]: numpy_helper.to_array(n.attribute[0].t)
                 for n in proto.graph.node if n.op_type == "Constant"}
    for n in proto.graph.node:
        if n.op_type == "Reshape":  # no static shape of the traced sizes: computed ones
            assert n.input[1] not in constants or n.input[0] in \
                {i.name for i in proto.graph.initializer}
    assert {"Shape", "Mul", "Concat", "Range"} <= {n.op_type for n in proto.graph.node}


def test_the_static_export_is_unchanged(tmp_path):
    """Without a symbolic dim: static shapes, no shape arithmetic, the same bytes from an
    array as from a TensorSpec of its shape."""
    em.seed(0)
    model = Block()
    x = _x((2, 5, 16))
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    em.onnx.save(model, str(a), x)
    em.onnx.save(model, str(b), em.TensorSpec((2, 5, 16)))
    assert a.read_bytes() == b.read_bytes()
    proto = onnx.load(str(a))
    assert _dims(proto.graph.input[0]) == [2, 5, 16]
    assert _dims(proto.graph.output[0]) == [2, 5, 16]
    assert not {"Shape", "Range"} & {n.op_type for n in proto.graph.node}
    for vi in proto.graph.value_info:
        assert all(isinstance(d, int) and d > 0 for d in _dims(vi))
    (got,) = _run(a, x)
    np.testing.assert_allclose(got, em.compile(model, x, backend="interpreter")(x), **TOL)


class Half(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x[: x.shape[0] // 2])


class Branch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = self.fc(x)
        return y * 2 if x.shape[0] > 3 else y


class Inverse(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).sum(0) * (1 / x.shape[0])


class Square(nn.Module):
    def forward(self, x):
        n = x.shape[0]
        return x.reshape(1, n * 4) + np.zeros((n * n, n * 4), np.float32)


@pytest.mark.parametrize("make, match", [
    (Half, r"cannot export Half with symbolic dim N: ember\.slice \(at .*test_onnx_dynamic"
           r"\.py:\d+\): its shape is \[1, 4\] at N=2; \[1, 4\] at N=3; \[2, 4\] at N=5; "
           r"\[2, 4\] at N=4: not a\*N \+ b"),
    (Branch, r"cannot export Branch with symbolic dim N: the traced graph changes with the "
             r"sizes: its op \d+ is func\.return at N=2 but ember\.constant .* at N=5 \(does "
             r"forward branch on a size\?\)"),
    (Inverse, r"ember\.constant \(test_onnx_dynamic\.py:\d+\): its value is 0\.5 at N=2; "
              r"0\.333.* at N=3; .*: not a\*N \+ b"),
    (Square, r"ember\.constant \(test_onnx_dynamic\.py:\d+\): its shape is \[4, 8\] at N=2; "
             r"\[9, 12\] at N=3.*: not a\*N \+ b"),
])
def test_a_graph_that_does_not_follow_n_is_refused_by_name(make, match, tmp_path):
    path = tmp_path / "m.onnx"
    with pytest.raises(OnnxExportError, match=match):
        em.onnx.save(make(), str(path), em.TensorSpec(("N", 4)))
    assert not path.exists()


def test_a_model_that_does_not_trace_at_a_fit_size_says_so(tmp_path):
    class Even(nn.Module):
        def forward(self, x):
            return x.reshape(x.shape[0] // 2, 8)

    with pytest.raises(OnnxExportError, match=r"does not trace at N=3: ShapeError: .* traces "
                                              r"it at sizes 2, 3, 4, 5 of each symbolic dim"):
        em.onnx.save(Even(), str(tmp_path / "m.onnx"), em.TensorSpec(("N", 4)))


def test_polynomials_of_the_sizes_are_fitted_and_checked():
    def points(symbols):
        from ember.interop.onnx_export import _points
        return _points(symbols)

    n = points(["N"])
    assert [p["N"] for p in n[:2]] == list(FIT_SIZES)
    assert str(_fit(["N"], n, [256 * p["N"] for p in n])) == "256*N"
    assert _fit(["N"], n, [7 for _ in n]) == Poly.of({(): 7})
    assert _fit(["N"], n, [p["N"] * p["N"] for p in n]) is None
    assert _fit(["N"], n, [p["N"] // 2 for p in n]) is None
    assert _fit(["N"], n, [1 / p["N"] for p in n]) is None
    nt = points(["N", "T"])
    p = _fit(["N", "T"], nt, [s["N"] * s["T"] - 3 * s["T"] + 1 for s in nt])
    assert str(p) == "1 - 3*T + N*T" and p({"N": 10, "T": 7}) == 50
    assert _fit(["N", "T"], nt, [s["N"] ** 2 * s["T"] for s in nt]) is None
    assert Poly.of({("N",): 1}).symbol == "N" and Poly.of({("N",): 2}).symbol is None


def test_round_trip_runs_at_every_size_in_ember(tmp_path):
    em.seed(0)
    model = Block()
    path = tmp_path / "block.onnx"
    em.onnx.save(model, str(path), em.TensorSpec(("N", "T", 16)))
    imported = em.onnx.load(str(path))
    assert imported.input_dims == [("N", "T", 16)]
    for k, shape in enumerate([(1, 1, 16), (3, 7, 16), (8, 4, 16)]):
        x = _x(shape, k)
        np.testing.assert_allclose(em.compile(imported, x, backend="interpreter")(x),
                                   em.compile(model, x, backend="interpreter")(x), **TOL)


def _sequence_model(dims_x, dims_m):
    """y = (x @ w) * mask[..., None]: inputs x [batch, sequence, 8], mask [batch, sequence]."""
    w = numpy_helper.from_array(np.eye(8, 4, dtype=np.float32), "w")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Unsqueeze", ["mask", "axes"], ["m"]),
             helper.make_node("Mul", ["h", "m"], ["y"])]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims_x),
                               helper.make_tensor_value_info("mask", TensorProto.FLOAT, dims_m)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [w, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_imported_sequence_dim_takes_any_size():
    m = em.onnx.load(_sequence_model(["batch", "sequence", 8], ["batch", "sequence"]))
    for n, t in [(1, 1), (2, 5), (3, 17)]:
        x, mask = _x((n, t, 8), t), (_x((n, t), n) > 0).astype(np.float32)
        got = em.compile(m, x, mask, backend="interpreter")(x, mask)
        np.testing.assert_allclose(got, (x @ np.eye(8, 4, dtype=np.float32)) * mask[..., None],
                                   **TOL)
    with pytest.raises(OnnxImportError, match="inputs 'x' and 'mask' disagree on symbolic dim "
                                              "sequence: 5 vs 6"):
        m.check_inputs((2, 5, 8), (2, 6))
    with pytest.raises(OnnxImportError, match=r"input 'x': the model takes \[batch, sequence, "
                                              r"8\], got \[2, 5, 9\]"):
        m.check_inputs((2, 5, 9), (2, 5))
    assert [s.shape for s in m.input_specs({"x": (2, 5, 8), "mask": (2, 5)})] == \
        [(2, 5, 8), (2, 5)]
    with pytest.raises(OnnxImportError, match="disagree on symbolic dim batch: 2 vs 3"):
        m.input_specs({"x": (2, 5, 8), "mask": (3, 5)})


def test_a_fixed_batch_runs_another_batch_where_the_graph_allows(tmp_path):
    """ember's static export of an MLP reads the batch only through MatMul: any batch runs.
    Its CNN's flatten holds the batch in a Reshape: another batch is refused, saying how to
    export it."""
    em.seed(0)
    mlp, cnn = models.Mlp(), models.Cnn()
    em.onnx.save(mlp, str(tmp_path / "mlp.onnx"), np.zeros((8, 64), np.float32))
    em.onnx.save(cnn, str(tmp_path / "cnn.onnx"), np.zeros((8, 1, 8, 8), np.float32))
    x = _x((64, 64))
    imported = em.onnx.load(str(tmp_path / "mlp.onnx"))
    np.testing.assert_allclose(em.compile(imported, x, backend="interpreter")(x),
                               em.compile(mlp, x, backend="interpreter")(x), **TOL)
    imported = em.onnx.load(str(tmp_path / "cnn.onnx"))
    x = _x((64, 1, 8, 8))
    with pytest.raises(OnnxImportError, match=r"input 'x': the model was exported for a batch "
                                              r"of 8 and its graph does not run a batch of 64 "
                                              r"\(node \d+ \(Reshape\).*\): export it with a "
                                              r"symbolic batch dim \(ember: em\.onnx\.save\("
                                              r"model, path, em\.TensorSpec\(\(\"N\", 1, 8, 8"):
        em.compile(imported, x, backend="interpreter")(x)
    with pytest.raises(OnnxImportError, match="does not run a batch of 5"):
        imported.check_inputs((5, 1, 8, 8))
    imported.check_inputs((8, 1, 8, 8))


def test_train_fine_tunes_a_dynamic_batch_export(tmp_path, capsys):
    em.seed(0)
    path = str(tmp_path / "cnn.onnx")
    em.onnx.save(models.Cnn(), path, em.TensorSpec(("N", 1, 8, 8)))
    assert main(["train", "--model", path, "--epochs", "1", "--no-progress"]) == 0
    assert "final test accuracy" in capsys.readouterr().out


def test_train_on_a_fixed_batch_export_says_to_export_a_symbolic_batch(tmp_path, capsys):
    em.seed(0)
    path = str(tmp_path / "cnn.onnx")
    em.onnx.save(models.Cnn(), path, np.zeros((8, 1, 8, 8), np.float32))
    assert main(["train", "--model", path, "--epochs", "1", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "exported for a batch of 8 and its graph does not run a batch of 1438" in err
    assert 'em.TensorSpec(("N", 1, 8, 8))' in err
