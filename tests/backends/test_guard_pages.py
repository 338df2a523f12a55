"""Every cpu kernel family, in f32 and f64 with threads on, under guard pages: each buffer
the executable allocates and each input ends where an inaccessible page begins, so a
kernel that reads or writes one element past a buffer faults. Results must match the
numpy interpreter.

Each group of cases runs in a subprocess (this file run as a script), so that a segfault
fails its test instead of killing pytest; the compile cache is off there.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.backends import cpu, interpreter
from ember.backends.cpu.call import buffers
from ember.backends.cpu.gemm import emit as gemm
from ember.backends.cpu.parallel import outline as threads
from ember.ir import Builder, Graph, TensorType, verify
from ember.passes import PassManager, parse_pipeline
from ember.runtime.models import Cnn

pytestmark = pytest.mark.slow  # every kernel family under guard pages


THREADS = 4
DTYPES = ("f32", "f64")
DEFAULTS = threads.MIN_WORK, gemm.THREAD_FLOPS  # the work above which loops, GEMMs split
GROUPS: dict[str, list] = {}  # group -> [(case function, dtypes to run it in)]


def case(group: str, dtypes: tuple[str, ...] = DTYPES):
    def register(fn):
        GROUPS.setdefault(group, []).append((fn, dtypes))
        return fn
    return register


# -- running a case (in the subprocess) ---------------------------------------------------

def graph(types, fn) -> Graph:
    g = Graph("f", [TensorType(s, d) for s, d in types])
    b = Builder(g.body)
    b.create("func.return", list(fn(b, *g.args)))
    return verify(g)


def lowered(g: Graph, pipeline: str) -> Graph:
    from ember.ir.parser import parse

    return PassManager(parse_pipeline(pipeline), verify_each=True).run(parse(str(g)))


def run_guarded(g: Graph, inputs) -> list[np.ndarray]:
    """Two calls (the second reuses returned buffers) with every buffer guarded."""
    with buffers.guarded():
        exe = cpu.Executable(g, threads=THREADS, use_cache=False)
        args = [buffers.guarded_copy(a) for a in inputs]
        exe(args)
        return exe(args)


def check(g: Graph, inputs, rtol: float) -> None:
    """g on the cpu, decomposed, unfused and fused, and fused again with every GEMM and
    loop split across threads, against the interpreter on g."""
    want = interpreter.run(g, inputs)
    variants = [("decompose", False), ("decompose,fuse", False), ("decompose,fuse", True)]
    for pipeline, split in variants:
        threads.MIN_WORK, gemm.THREAD_FLOPS = (1, 1) if split else DEFAULTS
        for got, ref in zip(run_guarded(lowered(g, pipeline), inputs), want):
            assert got.shape == ref.shape and got.dtype == ref.dtype, (pipeline, got, ref)
            np.testing.assert_allclose(got, ref, rtol=rtol,
                                       atol=rtol * max(1.0, float(np.abs(ref).max(initial=0))),
                                       err_msg=f"{pipeline} split={split}")


def rtol(dt: str) -> float:
    return 2e-4 if dt == "f32" else 1e-10


def normal(dt: str, *shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.dtype(dt.replace(
        "f", "float")))


def float_graph(dt: str, shapes, fn) -> tuple[Graph, list]:
    return graph([(s, dt) for s in shapes], fn), [normal(dt, *s, seed=i)
                                                 for i, s in enumerate(shapes)]


# -- the cases ----------------------------------------------------------------------------

@case("elementwise")
def elementwise_fused(dt):
    def fn(b, x, y):
        s = b.op("ember.sigmoid", b.op("ember.mul", x, y))  # y broadcast over rows
        t = b.op("ember.tanh", b.op("ember.add", b.op("ember.exp", b.op("ember.neg", x)), s))
        big = b.op("ember.cmp", x, y, predicate="gt")
        return [b.op("ember.select", big, t, b.op("ember.relu", x)),
                b.op("ember.cast", b.op("ember.abs", x), dtype="f32" if dt == "f64" else "f64"),
                b.op("ember.erf", y)]

    g, ins = float_graph(dt, [(37, 129), (129,)], fn)
    check(g, ins, rtol(dt))


@case("elementwise")
def transpose_reshape_broadcast(dt):
    def fn(b, x, v):
        t = b.op("ember.transpose", x, perm=[2, 0, 1])  # [5, 3, 7]
        r = b.op("ember.reshape", t, shape=[15, 7])
        v2 = b.op("ember.broadcast", v, shape=[15, 7])
        return [t, b.op("ember.sqrt", b.op("ember.add", b.op("ember.mul", r, r), v2)),
                b.op("ember.transpose", b.op("ember.exp", x), perm=[1, 2, 0])]

    g, ins = float_graph(dt, [(3, 7, 5), (7,)], fn)
    ins[1] = np.abs(ins[1])
    check(g, ins, rtol(dt))


@case("elementwise")
def dropout(dt):
    def fn(b, x, step):
        y = b.create("ember.dropout", [x, step], {"p": 0.3, "seed": 7, "key": 123}).result
        return [b.op("ember.mul", y, x), y]

    g = graph([((33, 17), dt), ((), "i64")], fn)
    check(g, [normal(dt, 33, 17), np.array(5, np.int64)], rtol(dt))


@case("elementwise")
def one_hot(dt):
    def fn(b, labels, x):
        oh = b.op("ember.one_hot", labels, num_classes=11, dtype=dt)
        return [oh, b.op("ember.mul", oh, x)]

    g = graph([((3, 13), "i64"), ((3, 13, 11), dt)], fn)
    labels = np.random.default_rng(0).integers(0, 11, (3, 13))
    check(g, [labels, normal(dt, 3, 13, 11)], rtol(dt))


@case("reductions")
def reductions(dt):
    def fn(b, x):
        return [b.op("ember.reduce_sum", x, axes=[0], keepdims=False),
                b.op("ember.reduce_mean", x, axes=[1], keepdims=True),
                b.op("ember.reduce_max", x, axes=[2], keepdims=False),
                b.op("ember.reduce_sum", x, axes=[0, 2], keepdims=True),
                b.op("ember.reduce_max", x, axes=[0, 1, 2], keepdims=False)]

    g, ins = float_graph(dt, [(7, 33, 131)], fn)
    check(g, ins, rtol(dt))


@case("reductions")
def softmaxes_and_layer_norm(dt):
    def fn(b, x, gamma, beta):
        return [b.op("nn.softmax", x, axis=1), b.op("nn.log_softmax", x, axis=0),
                b.create("nn.layer_norm", [x, gamma, beta], {"axes": [1], "eps": 1e-5}).result,
                b.create("nn.layer_norm", [x], {"axes": [0, 1], "eps": 1e-5}).result]

    g, ins = float_graph(dt, [(67, 129), (129,), (129,)], fn)
    check(g, ins, rtol(dt))


def matmul_graph(dt, a_shape, b_shape, epilogue=None, transpose_a=False):
    def fn(b, x, w):
        a = b.op("ember.transpose", x, perm=[1, 0]) if transpose_a else x
        y = b.op("ember.matmul", a, w)
        return [epilogue(b, y) if epilogue else y]

    g, ins = float_graph(dt, [a_shape, b_shape], fn)
    return g, ins


def tanh_t(b, y):
    """tanh of the product, its last two dims swapped: the GEMM cannot write it in place."""
    perm = list(range(y.type.rank - 2)) + [y.type.rank - 1, y.type.rank - 2]
    return b.op("ember.transpose", b.op("ember.tanh", y), perm=perm)


MATMULS = [  # a shape, b shape, epilogue, A transposed
    ((130, 130), (130, 65), None, False),  # in place
    ((130, 130), (130, 65), tanh_t, False),  # not in place: the product goes to scratch
    ((1, 130), (130, 65), None, False),  # 1 x N
    ((130, 1), (1, 3), tanh_t, False),
    ((200, 67), (200, 3), None, True),  # narrow and tall, A read down its columns: swapped
    ((200, 67), (200, 3), tanh_t, True),
    ((5, 33, 70), (5, 70, 19), lambda b, y: b.op("ember.exp", y), False),  # batched
    ((5, 33, 70), (5, 70, 19), tanh_t, False),
    ((3, 33, 70), (70, 129), None, False),  # B broadcast over the batch
    ((257, 300), (300, 129), lambda b, y: b.op("ember.relu", y), False),  # packs A and B
]


def engines():
    """Each GEMM engine in turn, whichever the cost table would pick (without OpenBLAS,
    "blas" runs the own GEMM again)."""
    for engine in ("own", "blas"):
        os.environ["EMBER_GEMM"] = engine
        yield engine
    del os.environ["EMBER_GEMM"]


@case("matmul")
def matmuls(dt):
    for _ in engines():
        for a_shape, b_shape, epilogue, transpose_a in MATMULS:
            check(*matmul_graph(dt, a_shape, b_shape, epilogue, transpose_a), rtol(dt))


CONVS = [  # x shape, w shape, stride, padding, dilation, groups
    ((2, 3, 7, 6), (5, 3, 3, 3), [1, 1], [1, 1], [1, 1], 1),
    ((3, 4, 9, 8), (6, 2, 3, 2), [2, 1], [0, 1], [1, 2], 2),
    ((2, 6, 8, 7), (6, 1, 3, 3), [2, 2], [1, 1], [1, 1], 6),
    ((4, 5, 13, 11), (7, 5, 1, 1), [1, 1], [0, 0], [1, 1], 1),
]


@case("conv")
def conv2d_and_gradients(dt):
    for _ in engines():
        for xs, ws, stride, pad, dil, groups in CONVS:
            a = {"stride": stride, "padding": pad, "dilation": dil, "groups": groups}

            def fn(b, x, w, a=a, xs=xs, ws=ws):
                y = b.create("ember.conv2d", [x, w], a).result
                gy = b.op("ember.tanh", y)
                gx = b.create("ember.conv2d_grad_input", [gy, w],
                              {**a, "input_shape": list(xs)}).result
                gw = b.create("ember.conv2d_grad_weight", [x, gy],
                              {**a, "weight_shape": list(ws)}).result
                return [y, gx, gw]

            check(*float_graph(dt, [xs, ws], fn), rtol(dt))


POOLS = [  # x shape, kernel, stride, padding
    ((2, 3, 8, 6), [2, 2], [2, 2], [0, 0]),  # windows tile the input exactly
    ((2, 3, 7, 6), [2, 2], [3, 2], [0, 0]),  # gaps, a row left over
    ((2, 3, 7, 6), [3, 2], [2, 1], [1, 1]),  # overlapping, padded
]


@case("pool")
def pools_and_gradients(dt):
    for kind in ("max", "avg"):
        for xs, kernel, stride, pad in POOLS:
            a = {"kernel": kernel, "stride": stride, "padding": pad}

            def fn(b, x, kind=kind, a=a, xs=xs):
                y = b.create(f"ember.{kind}_pool2d", [x], a).result
                g = b.op("ember.sigmoid", y)
                if kind == "max":
                    return [y, b.create("ember.max_pool2d_grad", [x, g], a).result]
                return [y, b.create("ember.avg_pool2d_grad", [g],
                                    {**a, "input_shape": list(xs)}).result]

            check(*float_graph(dt, [xs], fn), rtol(dt))


@case("pool")
def gather_scatter(dt):
    def fn(b, t, i):
        rows = b.op("ember.gather", t, i)
        return [rows, b.create("ember.scatter_add", [i, b.op("ember.exp", rows)],
                               {"shape": [7, 33]}).result]

    g = graph([((7, 33), dt), ((2, 5), "i64")], fn)
    check(g, [normal(dt, 7, 33), np.array([[0, 6, 3, 3, 1], [2, 2, 2, 5, 6]])], rtol(dt))


class Mlp(nn.Module):
    """Odd widths, GELU, layer norm and dropout before the head."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(37, 65)
        self.norm = nn.LayerNorm(65)
        self.dropout = nn.Dropout(0.2)
        self.head = nn.Linear(65, 10)

    def forward(self, x):
        return self.head(self.dropout(self.norm(nn.functional.gelu(self.fc(x)))))


@case("train", dtypes=("f32",))  # the layers' dtype
def train_steps(dt):
    """Three Adam steps of an MLP and a CNN on both backends."""
    rng = np.random.default_rng(0)
    for make, x in ((Mlp, rng.standard_normal((19, 37))),
                    (lambda: Cnn((3, 9, 9), channels=6), rng.standard_normal((5, 3, 9, 9)))):
        x = x.astype(np.float32)
        y = rng.integers(0, 10, len(x))
        results = {}
        for backend in ("interpreter", "cpu"):
            em.seed(0)
            model = make()
            step = em.compile_train_step(model, nn.functional.cross_entropy,
                                         optim.Adam(lr=1e-2), backend=backend)
            with buffers.guarded():
                xs, ys = buffers.guarded_copy(x), buffers.guarded_copy(y)
                losses = [float(step(xs, ys)) for _ in range(3)]
            results[backend] = losses, {k: p.val() for k, p in model.named_parameters()}
        (want_l, want_p), (got_l, got_p) = results["interpreter"], results["cpu"]
        np.testing.assert_allclose(got_l, want_l, rtol=1e-4)
        for k in want_p:
            np.testing.assert_allclose(got_p[k], want_p[k], rtol=1e-4, atol=1e-5, err_msg=k)


@case("f64_product_in_scratch", dtypes=("f64",))
def product_in_scratch(dt):
    """Regression: the GEMM's packed panels started 16 elements (128 bytes in f64) after
    a product kept in scratch, but the scratch size left 64 bytes for that gap, so this
    GEMM wrote 64 bytes past the scratch buffer."""
    g, ins = matmul_graph(dt, (130, 130), (130, 65), tanh_t)
    for _ in engines():
        for got, want in zip(run_guarded(lowered(g, "fuse"), ins), interpreter.run(g, ins)):
            np.testing.assert_allclose(got, want, rtol=rtol(dt))


def main(group: str) -> None:
    for fn, dtypes in GROUPS[group]:
        for dt in dtypes:
            fn(dt)
            print(f"ok {fn.__name__} {dt}", flush=True)


# -- the tests ----------------------------------------------------------------------------

def run_group(tmp_path, group: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EMBER_CACHE": "0", "EMBER_CACHE_DIR": str(tmp_path),
           "EMBER_NUM_THREADS": str(THREADS)}
    return subprocess.run([sys.executable, __file__, group], env=env, capture_output=True,
                          text=True, timeout=300)


def signal_of(rc: int) -> str:
    return f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"


@pytest.mark.skipif(sys.platform != "linux", reason="guard pages use mmap and mprotect")
@pytest.mark.parametrize("group", list(GROUPS))
def test_kernels_stay_inside_their_buffers(tmp_path, group):
    r = run_group(tmp_path, group)
    assert r.returncode == 0, f"{signal_of(r.returncode)}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
    assert r.stdout.count("ok ") == sum(len(dtypes) for _, dtypes in GROUPS[group])


def test_a_guarded_buffer_ends_at_a_page_that_faults():
    code = ("import ctypes, numpy as np\n"
            "from ember.backends.cpu.call import buffers\n"
            "a = buffers.guarded_copy(np.arange(5.0))\n"
            "assert a.tolist() == [0, 1, 2, 3, 4]\n"
            "print('read', flush=True)\n"
            "ctypes.c_double.from_address(a.ctypes.data + a.nbytes).value\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout == "read\n" and r.returncode == -signal.SIGSEGV, r.stderr


def test_every_buffer_an_executable_allocates_is_guarded():
    """Temps, constants, scalar inputs, scratch and returned results end at a page."""
    def fn(b, x, lr):
        c = b.op("ember.constant", value=np.full((3, 5), 2.0, np.float32))
        y = b.op("ember.transpose", b.op("ember.tanh", b.op("ember.matmul", x, c)),
                 perm=[1, 0])
        return [b.op("ember.mul", b.op("ember.exp", y), lr), y]

    kinds = set()
    for pipeline in ("fuse", "canonicalize"):  # scratch for the product; temps
        with buffers.guarded():
            exe = cpu.Executable(lowered(graph([((7, 3), "f32"), ((), "f32")], fn), pipeline),
                                 threads=THREADS, use_cache=False)
            results = exe([np.ones((7, 3), np.float32), 0.5])
        fixed = [(s.kind, a) for s, a in zip(exe.slots, exe._arrays) if a is not None]
        kinds |= {k for k, _ in fixed}
        for a in [a for _, a in fixed] + results:
            assert (a.ctypes.data + a.nbytes) % mmap.PAGESIZE == 0
    assert kinds == {"const", "temp", "scratch", "arg"}  # "arg": the scalar input's buffer


if __name__ == "__main__":
    main(sys.argv[1])
