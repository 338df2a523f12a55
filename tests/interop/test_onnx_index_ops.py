"""ONNX import of the ops real exports use beyond the basics, part two (interop/
onnx_ops_index.py): GatherElements, GatherND, ScatterElements, ScatterND and the sequence
ops, checked as test_onnx_more_ops.py checks part one (tests/onnx_nodes.py).
GatherElements over more than 64 entries is folded by ember's own numpy (ONNX's reference
implementation gets it wrong); a BERT exported without token_type_ids (slow; needs
`transformers`) matches PyTorch."""

import copy
import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402
from onnx_nodes import OnnxImportError, check, check_grad, model, rand, run_ember, run_ort  # noqa: E402

import ember as em  # noqa: E402

# -- GatherElements ------------------------------------------------------------------------

GATHER_CASES = [((1, 512), (1, 8), 1), ((2, 100), (2, 100), 1), ((100, 3), (100, 3), 0),
                ((100, 1), (100, 1), 0), ((70, 3), (5, 2), 0), ((3, 4, 80), (3, 2, 80), 2),
                ((3, 4, 5), (3, 6, 5), 1), ((4, 3), (4, 3), -1)]


def _gather_data(dshape, ishape, axis, seed=0):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(dshape).astype(np.float32)
    n = dshape[axis]
    idx = rng.integers(-n, n, ishape).astype(np.int64)
    coords = list(np.indices(ishape, sparse=True))
    coords[axis % len(dshape)] = idx
    return data, idx, data[tuple(coords)]


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
@pytest.mark.parametrize("dshape, ishape, axis", GATHER_CASES)
def test_gather_elements_folded_traced_and_static(dshape, ishape, axis, backend):
    """Folded (both inputs Constants: the BERT case), with constant indices, and with
    traced indices: each against numpy and onnxruntime."""
    data, idx, want = _gather_data(dshape, ishape, axis)
    node = helper.make_node("GatherElements", ["data", "idx"], ["y"], axis=axis)
    feeds = {"data": data, "idx": idx}
    for static in ("all", ["idx"], ()):
        check(node, feeds, {"y": np.float32}, static=static, want=want, rtol=0, atol=0,
              backend=backend)


def test_gather_elements_fold_is_embers_own():
    """Folded past 64 entries of the axis, where ONNX's reference implementation raises or
    (here: axis 0, indices [100, 1]) silently takes each row's own element."""
    data, idx, _ = _gather_data((100, 1), (100, 1), 0)
    idx[:] = 0
    node = helper.make_node("GatherElements", ["data", "idx"], ["y"], axis=0)
    check(node, {"data": data, "idx": idx}, {"y": np.float32}, static="all",
          want=np.broadcast_to(data[0], (100, 1)), rtol=0, atol=0)


def test_gather_elements_gradient_and_errors():
    data, idx, _ = _gather_data((3, 70), (3, 5), 1)
    node = helper.make_node("GatherElements", ["a", "idx"], ["y"], axis=1)
    check_grad(node, data.astype(np.float64), {"idx": idx}, wrt="a")
    idx[0, 0] = 70
    m = model([node], {"a": data}, {"y": np.float32}, consts={"idx": idx})
    with pytest.raises(OnnxImportError, match="indices 70 is out of range"):
        em.compile(em.onnx.load(m), data, backend="interpreter")
    u = np.zeros(1, np.float32)
    m = model([helper.make_node("GatherElements", ["a", "idx"], ["y"], axis=1)], {"u": u},
              {"y": np.float32}, consts={"a": data, "idx": idx})
    with pytest.raises(OnnxImportError, match="indices 70 is out of range"):
        em.compile(em.onnx.load(m), u, backend="interpreter")


# -- GatherND, ScatterND, ScatterElements -----------------------------------------------------

def _gather_nd(data, idx, b):
    out = np.empty(idx.shape[:-1] + data.shape[b + idx.shape[-1]:], data.dtype)
    for pos in np.ndindex(*idx.shape[:-1]):
        out[pos] = data[pos[:b] + tuple(idx[pos])]
    return out


GATHER_ND = [((2, 3, 4), (5, 2), 0), ((2, 3, 4), (5, 3), 0), ((2, 3, 4), (2, 1), 0),
             ((2, 3, 4), (2, 2), 1), ((2, 3, 4), (2, 6, 1), 1), ((2, 3, 4, 5), (2, 3, 1), 2),
             ((4, 3), (2,), 0)]


@pytest.mark.parametrize("dshape, ishape, b", GATHER_ND)
def test_gather_nd(dshape, ishape, b):
    rng = np.random.default_rng(3)
    data = rng.standard_normal(dshape).astype(np.float32)
    m = ishape[-1]
    hi = np.array(dshape[b:b + m])
    idx = (rng.integers(0, 1 << 30, ishape) % hi - (rng.random(ishape) < 0.3) * hi)
    node = helper.make_node("GatherND", ["data", "idx"], ["y"], batch_dims=b)
    feeds = {"data": data, "idx": idx.astype(np.int64)}
    want = _gather_nd(data, idx % hi, b)
    for static in ((), ["idx"], "all"):
        check(node, feeds, {"y": np.float32}, static=static, want=want, rtol=0, atol=0)


def test_gather_nd_gradient():
    node = helper.make_node("GatherND", ["a", "idx"], ["y"])
    check_grad(node, rand(3, 4, 2).astype(np.float64),
               {"idx": np.array([[0, 1], [2, 3], [0, 1]], np.int64)}, wrt="a")


@pytest.mark.parametrize("reduction", ["none", "add"])
@pytest.mark.parametrize("static", [(), ["idx"], "all"])
@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_scatter_nd(reduction, static, backend):
    rng = np.random.default_rng(4)
    data = rng.standard_normal((4, 3, 2)).astype(np.float32)
    idx = np.array([[1, 2], [3, 0], [0, -1]], np.int64)
    upd = rng.standard_normal((3, 2)).astype(np.float32)
    want = data.copy()
    for i, u in zip(idx, upd):
        if reduction == "add":
            want[tuple(i)] += u
        else:
            want[tuple(i)] = u
    node = helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"], reduction=reduction)
    check(node, {"data": data, "idx": idx, "upd": upd}, {"y": np.float32}, static=static,
          want=want, rtol=1e-6, backend=backend)


def test_scatter_nd_duplicates_and_whole_rows():
    data = rand(4, 3)
    idx = np.array([[1], [3], [1]], np.int64)
    upd = rand(3, 3, seed=1)
    want = data.copy()
    want[1], want[3] = upd[2], upd[1]  # the last write wins (numpy's, a sequential loop's)
    node = helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"])
    m = model([node], {"data": data, "upd": upd}, {"y": np.float32}, consts={"idx": idx})
    np.testing.assert_array_equal(run_ember(m, {"data": data, "upd": upd})[0], want)
    add = helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"], reduction="add")
    want = data.copy()
    np.add.at(want, idx[:, 0], upd)
    check(add, {"data": data, "idx": idx, "upd": upd}, {"y": np.float32}, static=["idx"],
          want=want, rtol=1e-6)


def test_scatter_gradients():
    idx = np.array([[1, 2], [3, 0], [0, 1], [2, 2]], np.int64)
    for reduction in ("none", "add"):
        node = helper.make_node("ScatterND", ["a", "idx", "upd"], ["y"], reduction=reduction)
        check_grad(node, rand(4, 3).astype(np.float64),
                   {"idx": idx, "upd": rand(4, seed=1).astype(np.float64)}, wrt="a")
        node = helper.make_node("ScatterND", ["data", "idx", "a"], ["y"], reduction=reduction)
        check_grad(node, rand(4).astype(np.float64),
                   {"idx": idx, "data": rand(4, 3).astype(np.float64)}, wrt="a")
        node = helper.make_node("ScatterElements", ["data", "idx", "a"], ["y"], axis=1,
                                reduction=reduction)
        check_grad(node, rand(2, 2).astype(np.float64),
                   {"idx": np.array([[2, 0], [1, 2]], np.int64),
                    "data": rand(2, 3).astype(np.float64)}, wrt="a")


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("reduction", ["none", "add"])
@pytest.mark.parametrize("static", [(), ["idx"], "all"])
def test_scatter_elements(axis, reduction, static):
    rng = np.random.default_rng(7)
    data = rng.standard_normal((3, 70)).astype(np.float32)
    n = data.shape[axis]
    ishape = (2, 5) if axis == 0 else (3, 4)
    # distinct positions per row (none's result with duplicates is the order's)
    idx = np.stack([rng.permutation(n)[:ishape[axis]] for _ in range(ishape[1 - axis % 2])],
                   1 - axis % 2).astype(np.int64)
    idx[0, 0] -= n  # a negative one
    upd = rng.standard_normal(ishape).astype(np.float32)
    want = data.copy()
    for pos in np.ndindex(*ishape):
        target = list(pos)
        target[axis] = idx[pos] % n
        if reduction == "add":
            want[tuple(target)] += upd[pos]
        else:
            want[tuple(target)] = upd[pos]
    node = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=axis,
                            reduction=reduction)
    check(node, {"data": data, "idx": idx, "upd": upd}, {"y": np.float32}, static=static,
          want=want, rtol=1e-6)


def test_scatter_of_bools_and_ints():
    data = np.zeros((2, 4), bool)
    idx = np.array([[1, 3], [0, 0]], np.int64)
    node = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=1)
    check(node, {"data": data, "idx": idx, "upd": np.ones((2, 2), bool)}, {"y": bool},
          static=["idx"])
    data = np.arange(8, dtype=np.int64).reshape(2, 4)
    node = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=1,
                            reduction="add")
    check(node, {"data": data, "idx": idx, "upd": np.full((2, 2), 5, np.int64)},
          {"y": np.int64})


@pytest.mark.parametrize("reduction", ["mul", "max", "min"])
def test_scatter_reductions_ember_lacks_are_refused(reduction):
    for op in ("ScatterND", "ScatterElements"):
        m = model([helper.make_node(op, ["x", "i", "u"], ["y"], reduction=reduction)],
                  {"x": rand(3, 2), "u": rand(1, 2)}, {"y": np.float32},
                  consts={"i": np.array([[1]], np.int64)})
        with pytest.raises(OnnxImportError, match=f"reduction='{reduction}' is not supported"):
            em.onnx.load(m)


# -- sequences ---------------------------------------------------------------------------

@pytest.mark.parametrize("split, keepdims, new_axis", [  # stacking needs equal pieces
    (None, 1, 0), (None, 0, 0), (None, 1, 1), (None, 0, 1), (np.array(2, np.int64), 1, 0),
    (np.array([1, 3, 1], np.int64), 1, 0)])
@pytest.mark.parametrize("pos", [0, -1, 1])
def test_split_to_sequence_at_and_concat(split, keepdims, new_axis, pos):
    x = rand(2, 5, 3, seed=9)
    ins = ["x"] if split is None else ["x", "split"]
    nodes = [helper.make_node("SplitToSequence", ins, ["s"], axis=1, keepdims=keepdims),
             helper.make_node("SequenceAt", ["s", "p"], ["a"]),
             helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=-1 if new_axis else 1,
                              new_axis=new_axis),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    consts = {"p": np.array(pos, np.int64)} | ({} if split is None else {"split": split})
    outs = {"a": np.float32, "c": np.float32, "n": np.int64}
    for traced in (True, False):
        m = model(nodes, {"x": x} if traced else {"u": np.zeros(1, np.float32)}, outs,
                  consts=consts | ({} if traced else {"x": x}))
        feeds = {"x": x} if traced else {"u": np.zeros(1, np.float32)}
        for g, r in zip(run_ember(m, feeds), run_ort(m, feeds)):
            assert g.shape == r.shape and g.dtype == r.dtype
            np.testing.assert_array_equal(g, r)


def test_sequence_construct_insert_erase_and_gradient():
    a, b = rand(2, 3), rand(2, 3, seed=1)
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceInsert", ["s", "a", "p"], ["s2"]),
             helper.make_node("SequenceErase", ["s2"], ["s3"]),
             helper.make_node("ConcatFromSequence", ["s3"], ["y"], axis=0)]
    m = model(nodes, {"a": a, "b": b}, {"y": np.float32}, consts={"p": np.array(1, np.int64)})
    np.testing.assert_array_equal(run_ember(m, {"a": a, "b": b})[0],
                                  run_ort(m, {"a": a, "b": b})[0])
    split = helper.make_node("SplitToSequence", ["q"], ["s"], axis=1, keepdims=0)
    at = helper.make_node("SequenceAt", ["s", "p"], ["t"])
    w = rand(3, 4).astype(np.float64)
    x = np.ones_like(w)
    m = model([helper.make_node("Mul", ["w", "x"], ["q"]), split, at,
               helper.make_node("Mul", ["t", "t"], ["y"])], {"x": x}, {"y": np.float64},
              consts={"p": np.array(-1, np.int64)}, inits={"w": w})
    imported = em.onnx.load(m)
    r = rand(3, seed=3).astype(np.float64)
    grads = em.compile_grad(imported, lambda o, t: (o * t).sum())(x, r)
    want = np.zeros_like(w)
    want[:, -1] = 2 * w[:, -1] * r
    np.testing.assert_allclose(grads[imported.initializers["w"]], want, rtol=1e-12)


def test_sequence_at_out_of_range_is_refused():
    x = rand(2, 3)
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["y"])]
    m = model(nodes, {"x": x}, {"y": np.float32}, consts={"p": np.array(2, np.int64)})
    with pytest.raises(OnnxImportError, match="position 2 is out of range"):
        em.compile(em.onnx.load(m), x, backend="interpreter")


# -- a BERT -------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("token_types", [True, False])
def test_bert_matches_pytorch(token_types):
    """A small random BERT exported with and without token_type_ids (then its buffer of
    zeros goes through GatherElements over 512 positions, folded at import)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64,
                                     num_attention_heads=2, intermediate_size=128,
                                     vocab_size=100)
    bert = transformers.BertModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask, types=None):
            return self.bert(input_ids=ids, attention_mask=mask,
                             token_type_ids=types).last_hidden_state

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, (2, 8)).astype(np.int64)
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0
    types = (np.arange(8)[None, :].repeat(2, 0) >= 4).astype(np.int64)
    inputs = (ids, mask, types) if token_types else (ids, mask)
    wrapper = Hidden()
    with torch.no_grad():  # before the export, which may leave the model changed
        want = copy.deepcopy(wrapper)(*map(torch.from_numpy, inputs)).numpy()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, tuple(map(torch.from_numpy, inputs)), f, dynamo=False,
                          opset_version=17, input_names=["ids", "mask", "types"][:len(inputs)],
                          output_names=["y"])
    got = em.compile(em.onnx.load(f.getvalue()), *inputs, backend="cpu")(*inputs)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
