"""bf16 and f16 on the interpreter: each op computes in f32 and rounds its result once
(ir/precision.py), which is what PyTorch's CPU kernels give for the same dtype (compared
with torch's own tolerances for it); casts between every float dtype round as torch's."""

import ml_dtypes
import numpy as np
import pytest

from ember.backends import interpreter
from ember.ir import Builder, Graph, TensorType, dtype_of, numpy_dtype, verify
from ember.passes.decompose import Decompose

torch = pytest.importorskip("torch")

rng = np.random.default_rng(0)
LOW = ("bf16", "f16")
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
         "f64": torch.float64}


def run(name, *arrays, decompose=False, **attrs):
    g = Graph("f", [TensorType(a.shape, dtype_of(a.dtype)) for a in arrays])
    b = Builder(g.body)
    b.create("func.return", [b.op(name, *g.args, **attrs)])
    (out,) = interpreter.run(verify(Decompose().apply(g) if decompose else g), list(arrays))
    return out


def as_torch(a: np.ndarray):
    """The same values as a torch tensor of the same dtype (bf16 through its bits)."""
    if a.dtype == numpy_dtype("bf16"):
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def values(dtype, *shape, low=-2.0, high=2.0):
    return rng.uniform(low, high, size=shape).astype(numpy_dtype(dtype))


def close(ours: np.ndarray, theirs) -> None:
    """Within torch's tolerance for the dtype (bf16: rtol 1.6e-2, f16: 1e-3)."""
    assert ours.dtype == numpy_dtype(dtype_of_torch(theirs.dtype))
    torch.testing.assert_close(as_torch(ours), theirs)


def dtype_of_torch(t) -> str:
    return {v: k for k, v in TORCH.items()}[t]


CASES = {  # ember op and attributes, torch's function, operand shapes (and value range)
    "add": ("ember.add", {}, torch.add, [(4, 33), (33,)]),
    "mul": ("ember.mul", {}, torch.mul, [(4, 33), (4, 33)]),
    "div": ("ember.div", {}, torch.div, [(4, 33), (4, 33, "pos")]),
    "exp": ("ember.exp", {}, torch.exp, [(4, 33)]),
    "tanh": ("ember.tanh", {}, torch.tanh, [(4, 33)]),
    "rsqrt": ("ember.rsqrt", {}, torch.rsqrt, [(4, 33, "pos")]),
    "matmul": ("ember.matmul", {}, torch.matmul, [(5, 300), (300, 7)]),
    "sum": ("ember.reduce_sum", {"axes": [1], "keepdims": False},
            lambda x: x.sum(1), [(6, 1000)]),
    "mean": ("ember.reduce_mean", {"axes": [0, 1], "keepdims": True},
             lambda x: x.mean((0, 1), keepdim=True), [(30, 40)]),
    "softmax": ("nn.softmax", {"axis": -1}, lambda x: torch.softmax(x, -1), [(5, 64)]),
    "log_softmax": ("nn.log_softmax", {"axis": 1}, lambda x: torch.log_softmax(x, 1),
                    [(5, 64)]),
    "layer_norm": ("nn.layer_norm", {"axes": [-1], "eps": 1e-5},
                   lambda x, g, b: torch.nn.functional.layer_norm(x, (96,), g, b, 1e-5),
                   [(4, 96), (96,), (96,)]),
}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("case", sorted(CASES))
def test_ops_give_what_torch_gives_on_the_cpu(case, dtype):
    """nn.* ops also decomposed: `decompose` lowers them in f32, between casts."""
    name, attrs, fn, shapes = CASES[case]
    args = [values(dtype, *s[:-1], low=0.5) if s[-1] == "pos" else values(dtype, *s)
            for s in shapes]
    want = fn(*map(as_torch, args))
    for decompose in (False, True) if name.startswith("nn.") else (False,):
        close(run(name, *args, decompose=decompose, **attrs), want)


@pytest.mark.parametrize("dtype", LOW)
def test_an_op_rounds_its_f32_result_once(dtype):
    """Each op's f32 value, rounded: bit for bit, matmul and sums accumulating in f32."""
    x, w = values(dtype, 8, 500), values(dtype, 500, 3)
    f32 = [a.astype(np.float32) for a in (x, w)]
    assert run("ember.matmul", x, w).tobytes() == (f32[0] @ f32[1]).astype(x.dtype).tobytes()
    assert run("ember.reduce_sum", x, axes=[1], keepdims=False).tobytes() == \
        f32[0].sum(1).astype(x.dtype).tobytes()
    assert run("ember.exp", x).tobytes() == np.exp(f32[0]).astype(x.dtype).tobytes()


SPECIAL = np.array([0.0, -0.0, 1.0, 1 + 2**-8 + 2**-30, 1 + 2**-11 + 2**-40, 3.4e38, 70000.0,
                    1e-30, -1e-6, np.inf, -np.inf, np.nan, 2.5, -7.75])


@pytest.mark.parametrize("src", ["f64", "f32", "f16", "bf16"])
@pytest.mark.parametrize("dst", ["f64", "f32", "f16", "bf16"])
def test_casts_between_float_dtypes_round_as_torch(src, dst):
    """To bf16/f16 through f32, as torch converts (numpy and ml_dtypes round an f64 once,
    so 1 + 2**-8 + 2**-30 becomes bf16 1.0078125 there and 1.0 here and in torch)."""
    with np.errstate(over="ignore"):
        x = SPECIAL.astype(np.float32).astype(numpy_dtype(src)) if src != "f64" else SPECIAL
    out = run("ember.cast", x, dtype=dst)
    want = as_torch(np.asarray(x)).to(TORCH[dst])
    assert out.dtype == numpy_dtype(dst)
    torch.testing.assert_close(as_torch(out), want, rtol=0, atol=0, equal_nan=True)


def test_bf16_is_ml_dtypes_bfloat16_with_two_bytes():
    t = TensorType((3, 5), "bf16")
    assert numpy_dtype("bf16") == np.dtype(ml_dtypes.bfloat16) and t.nbytes == 30
    assert dtype_of(ml_dtypes.bfloat16) == "bf16"
