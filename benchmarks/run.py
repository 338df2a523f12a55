"""ember's cpu backend side by side with numpy, PyTorch and JAX: one process, one table.

Run: `python benchmarks/run.py` (`--quick` for fewer repetitions, `--only sgemm,eltwise,
steps,gpt,cnn,compile`, `--gpt A64,B128,A256`, `--precision 32,bf16-mixed`). Every number is a
median of timed repetitions; ratios are ember's speed over the other's (above 1: ember is
faster). Rows:
- sgemm 256^3/512^3/1024^3: GFLOP/s of ember's own GEMM and of its default choice (the
  cost table: own or OpenBLAS), against numpy's BLAS and the machine's peak (vector
  lanes x FMA units x 2 x cores x clock);
- elementwise add, gelu (tanh form: 8 numpy ops, one fused ember kernel) and exp (on
  N(0,1) and on half -inf lanes, what a causal mask gives softmax) on 1M and 16M
  floats: GB/s of the bytes each must move;
- training steps (forward, backward, SGD) of MLP 64-128-10 b64, MLP 784-512-512-10 b128 and
  the digits CNN b64, against a hand-written numpy step (also run in a subprocess with
  OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset, which some machines set to a slower
  kernel), PyTorch eager and torch.compile, and JAX jit when installed, timed in
  interleaved blocks; for the MLPs also the step's matmuls alone in numpy's BLAS, the
  floor of any step that uses that BLAS; and the step's call path: its Python alone (the
  step timed with its native entry swapped for one that returns at once: a difference of
  two medians would hold a large step's noise), and its time over its native call alone
  (buffers bound once) and over its kernels' time (the cycle counter's span of each
  kernel: not the call, nor the input checks before the first kernel), the three timed in
  interleaved blocks, each call on its own (the medians of calls, as the kernels' are of
  runs);
- bf16 GEMM 1024^3 (AMX tiles, else AVX512-BF16 dot products; f32 sums) against
  PyTorch's bf16 matmul, where the CPU has either;
- char-level GPT training steps (AdamW; benchmarks/gpt.py): config A (n_embd 64, 4 heads,
  2 layers) at T 64 and 256, config B (n_embd 128, 4 layers) at T 128, batch 16, and G,
  the GPT-2-small body (n_embd 768, 12 heads, 12 layers, batch 4: `--gpt G256`), against
  PyTorch eager and torch.compile on the same initial weights, interleaved; with
  `--precision bf16-mixed` ember's mixed step against its f32 step and PyTorch's under
  `torch.autocast("cpu", dtype=torch.bfloat16)`;
- CNNs (benchmarks/cnn_rows.py): the ResNet-18 CIFAR training step (batch 32) against
  PyTorch eager and torch.compile; ONNX exports of ResNet-18 at 224 (batch 1 and 8),
  MobileNetV2 and MobileNetV3-small against onnxruntime, PyTorch eager and torch.compile;
- compile times: first (empty cache) and cached (a second process).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import timing
from cnn_rows import bench_cnn
from gpt_steps import bench_gpt
from timing import blas_info, calls_for, interleaved, machine, median_time, python_path, torch_train

# torch.compile's pool of compile workers keeps starting in the background after the first
# compile: on a small machine it steals the cores from whatever is timed next (PyTorch eager
# 5-10x slower, seen on a 2-core VM)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

def compiled(graph_fn, shapes, env: dict | None = None, dtype: str = "f32"):
    """An ember Executable for a graph of `dtype` arguments built by graph_fn(builder,
    *args), fused."""
    from ember.backends import cpu
    from ember.ir import Builder, Graph, TensorType
    from ember.passes import PassManager, parse_pipeline

    g = Graph("bench", [TensorType(s, dtype) for s in shapes])
    b = Builder(g.body)
    b.create("func.return", list(graph_fn(b, *g.args)))
    g = PassManager(parse_pipeline("fuse")).run(g)
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        return cpu.Executable(g, use_cache=False)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def bench_bf16_gemm(rows: list) -> None:
    """C (f32) = A B of bf16 1024^3 (`ember.matmul {dtype = "f32"}`) on AMX tiles, or on
    AVX512-BF16 dot products where the CPU has no AMX."""
    import ml_dtypes

    from ember.backends.cpu.machine.host import host_isa

    isa = host_isa()
    if not isa.bf16_gemm:
        rows.append(("bf16 GEMM 1024^3", "skipped", "no AMX-BF16 or AVX512-BF16", "", ""))
        return
    n = 1024
    exe = compiled(lambda bl, x, y: [bl.op("ember.matmul", x, y, dtype="f32")], [(n, n)] * 2,
                   dtype="bf16")
    rng = np.random.default_rng(0)
    a, w = (rng.standard_normal((n, n)).astype(ml_dtypes.bfloat16) for _ in range(2))
    flops = 2 * n ** 3
    number = calls_for(flops / 1e12)
    gf = flops / entry_time(exe, [a, w], number) / 1e9
    other = ""
    if importlib.util.find_spec("torch") is not None:
        import torch

        ta, tw = (torch.from_numpy(x.astype(np.float32)).bfloat16() for x in (a, w))
        t_torch = median_time(lambda: ta @ tw, number)
        other = f"torch {flops / t_torch / 1e9:6.0f}"
    kernel = "AMX" if isa.bf16_tiles else "AVX512-BF16"
    rows.append((f"bf16 GEMM 1024^3 ember ({kernel})", f"{gf:7.0f} GFLOP/s", other, "", ""))


def entry_time(exe, inputs, number, params=None) -> float:
    """Median seconds of the native call alone (buffers bound once)."""
    return median_time(exe.bound(inputs, params), number)


def bench_sgemm(rows: list, peak: float) -> None:
    rng = np.random.default_rng(0)
    for n in (256, 512, 1024):
        a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        out = np.empty((n, n), np.float32)
        flops = 2 * n ** 3
        number = calls_for(flops / 1e11)
        t_np = median_time(lambda a=a, b=b, out=out: np.matmul(a, b, out=out), number)
        for label, env in (("own", {"EMBER_GEMM": "own"}), ("auto", {})):
            exe = compiled(lambda bl, x, y: [bl.op("ember.matmul", x, y)], [(n, n)] * 2, env)
            t = entry_time(exe, [a, b], number)
            gf = flops / t / 1e9
            rows.append((f"sgemm {n}^3 ember {label}", f"{gf:7.1f} GFLOP/s",
                         f"numpy {flops / t_np / 1e9:6.1f}", f"x{t_np / t:5.2f}",
                         f"{100 * gf / peak:4.0f}% of peak" if peak else ""))


def bench_eltwise(rows: list) -> None:
    rng = np.random.default_rng(1)
    c = np.float32(0.7978845608028654)

    def gelu_np(x):
        return 0.5 * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))

    def gelu_ir(b, x):
        def k(v):
            return b.op("ember.constant", value=np.array(v, np.float32))
        inner = b.op("ember.mul", k(c), b.op("ember.add", x, b.op(
            "ember.mul", k(0.044715), b.op("ember.mul", x, b.op("ember.mul", x, x)))))
        return [b.op("ember.mul", b.op("ember.mul", k(0.5), x),
                     b.op("ember.add", k(1.0), b.op("ember.tanh", inner)))]

    for n in (1 << 20, 1 << 24):
        _eltwise(rows, n, rng, gelu_np, gelu_ir)
    _eltwise_edges(rows, 1 << 20, rng)


def _eltwise(rows, n, rng, gelu_np, gelu_ir) -> None:
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    out = np.empty(n, np.float32)
    size = f"{n >> 20}M"
    number = calls_for(n * 12 / 20e9)
    exe = compiled(lambda b, p, q: [b.op("ember.add", p, q)], [(n,), (n,)])
    t, t_np = entry_time(exe, [x, y], number), median_time(
        lambda: np.add(x, y, out=out), number)
    rows.append((f"add {size} f32", f"{3 * 4 * n / t / 1e9:7.1f} GB/s",
                 f"numpy {3 * 4 * n / t_np / 1e9:6.1f}", f"x{t_np / t:5.2f}", ""))
    exe = compiled(gelu_ir, [(n,)])
    t, t_np = entry_time(exe, [x], number), median_time(lambda: gelu_np(x), number)
    rows.append((f"gelu(tanh) {size} f32", f"{2 * 4 * n / t / 1e9:7.1f} GB/s",
                 f"numpy {2 * 4 * n / t_np / 1e9:6.1f}", f"x{t_np / t:5.2f}",
                 "8 numpy ops vs 1 kernel"))
    exe = compiled(lambda b, p: [b.op("ember.exp", p)], [(n,)])
    masked = np.where(np.arange(n) % 2 == 0, x, -np.inf).astype(np.float32)  # a causal mask
    for label, v in (("N(0,1)", x), ("half -inf", masked)):
        t, t_np = entry_time(exe, [v], number), median_time(lambda v=v: np.exp(v), number)
        rows.append((f"exp {size} f32 {label}", f"{2 * 4 * n / t / 1e9:7.1f} GB/s",
                     f"numpy {2 * 4 * n / t_np / 1e9:6.1f}", f"x{t_np / t:5.2f}", ""))



def _eltwise_edges(rows, n, rng) -> None:
    """log and tanh on ordinary arguments and with half the lanes where libmvec took a
    slow path (log of 0, tanh of +-inf: 8x, 2.5x): ember's should read the same."""
    x = rng.standard_normal(n).astype(np.float32)
    half = np.arange(n) % 2 == 0
    number = calls_for(n * 8 / 20e9)
    pos = np.abs(x) + np.float32(0.5)
    for fn, cases in (("log", (("|N(0,1)|+.5", pos), ("half 0", np.where(half, pos, 0)))),
                      ("tanh", (("N(0,1)", x), ("half +-inf", np.where(half, x, x * np.inf))))):
        exe = compiled(lambda b, p, fn=fn: [b.op(f"ember.{fn}", p)], [(n,)])
        for label, v in cases:
            v = v.astype(np.float32)
            with np.errstate(all="ignore"):
                t = entry_time(exe, [v], number)
                t_np = median_time(lambda v=v, fn=fn: getattr(np, fn)(v), number)
            rows.append((f"{fn} {n >> 20}M f32 {label}", f"{2 * 4 * n / t / 1e9:7.1f} GB/s",
                         f"numpy {2 * 4 * n / t_np / 1e9:6.1f}", f"x{t_np / t:5.2f}", ""))

# -- training steps ----------------------------------------------------------------------------

LR = 0.05
STEPS = {"mlp-small": ([64, 128, 10], 64), "mlp-large": ([784, 512, 512, 10], 128),
         "cnn": (None, 64)}


def init_params(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def u(fan_in, *shape):
        bound = 1 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    if name == "cnn":
        return {"wc": u(9, 16, 1, 3, 3), "bc": u(9, 16), "w": u(256, 256, 10), "b": u(256, 10)}
    sizes = STEPS[name][0]
    out = {}
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        out[f"w{i}"], out[f"b{i}"] = u(a, a, b), u(a, b)
    return out


def data(name: str, seed: int = 1):
    rng = np.random.default_rng(seed)
    n = STEPS[name][1]
    shape = (n, 1, 8, 8) if name == "cnn" else (n, STEPS[name][0][0])
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, n)


def numpy_step(name: str, p: dict):
    """A hand-written numpy SGD step (the reference a careful numpy user would write)."""
    def ce(z, y):
        z = z - z.max(1, keepdims=True)
        e = np.exp(z)
        prob = e / e.sum(1, keepdims=True)
        loss = -np.log(prob[np.arange(len(y)), y]).mean()
        prob[np.arange(len(y)), y] -= 1
        return loss, prob / len(y)

    if name != "cnn":
        n_layers = len(p) // 2

        def step(x, y):
            acts, hs = [x], []
            for i in range(n_layers):
                h = acts[-1] @ p[f"w{i}"] + p[f"b{i}"]
                hs.append(h)
                acts.append(np.maximum(h, 0) if i < n_layers - 1 else h)
            loss, d = ce(acts[-1], y)
            for i in reversed(range(n_layers)):
                gw, gb = acts[i].T @ d, d.sum(0)
                if i:
                    d = (d @ p[f"w{i}"].T) * (hs[i - 1] > 0)
                p[f"w{i}"] -= LR * gw
                p[f"b{i}"] -= LR * gb
            return loss
        return step

    def step(x, y):
        n = x.shape[0]
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
        cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(n * 64, 9)
        conv = cols @ p["wc"].reshape(16, -1).T + p["bc"]
        a = np.maximum(conv, 0).reshape(n, 8, 8, 16).transpose(0, 3, 1, 2)
        r = a.reshape(n, 16, 4, 2, 4, 2)
        pooled = r.max(axis=(3, 5))
        flat = pooled.reshape(n, -1)
        loss, dz = ce(flat @ p["w"] + p["b"], y)
        dpool = (dz @ p["w"].T).reshape(pooled.shape)
        first = r == pooled[:, :, :, None, :, None]
        da = (first * dpool[:, :, :, None, :, None]).reshape(n, 16, 8, 8)
        dconv = (da * (a > 0)).transpose(0, 2, 3, 1).reshape(n * 64, 16)
        for k, g in (("wc", (dconv.T @ cols).reshape(16, 1, 3, 3)), ("bc", dconv.sum(0)),
                     ("w", flat.T @ dz), ("b", dz.sum(0))):
            p[k] -= LR * g
        return loss
    return step


def ember_step(name: str):
    import ember as em
    from ember import nn, optim

    class Mlp(nn.Module):
        def __init__(self, sizes):
            super().__init__()
            self.layers = [nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])]

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                x = nn.functional.relu(x) if i < len(self.layers) - 1 else x
            return x

    class Cnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 16, 3, padding=1)
            self.pool = nn.MaxPool2d(2)
            self.head = nn.Linear(256, 10)

        def forward(self, x):
            x = self.pool(nn.functional.relu(self.conv(x)))
            return self.head(x.reshape(x.shape[0], -1))

    em.seed(0)
    model = Cnn() if name == "cnn" else Mlp(STEPS[name][0])
    t = time.perf_counter()
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=LR),
                                 backend="cpu")
    x, y = data(name)
    step(x, y)
    first = time.perf_counter() - t
    return step, first


def torch_step(name: str, p: dict, compile_: bool):
    import torch

    if name == "cnn":
        net = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                  torch.nn.Linear(256, 10))
    else:
        sizes = STEPS[name][0]
        layers = []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers += [torch.nn.Linear(a, b)] + ([torch.nn.ReLU()] if i < len(sizes) - 2 else [])
        net = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    return torch_train(lambda x, y: torch.nn.functional.cross_entropy(net(x), y), opt,
                       compile_, *data(name))


def jax_step(name: str, p: dict):
    """The same SGD step in JAX, jitted (params as a pytree, updated functionally)."""
    import jax
    import jax.numpy as jnp

    def forward(q, x):
        if name == "cnn":
            y = jax.lax.conv_general_dilated(x, q["wc"], (1, 1), [(1, 1), (1, 1)])
            y = jnp.maximum(y + q["bc"][None, :, None, None], 0)
            y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                      "VALID")
            return y.reshape(x.shape[0], -1) @ q["w"] + q["b"]
        n = len(q) // 2
        for i in range(n):
            x = x @ q[f"w{i}"] + q[f"b{i}"]
            x = jnp.maximum(x, 0) if i < n - 1 else x
        return x

    def loss_fn(q, x, y):
        logp = jax.nn.log_softmax(forward(q, x))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def train(q, x, y):
        loss, g = jax.value_and_grad(loss_fn)(q, x, y)
        return loss, jax.tree_util.tree_map(lambda a, b: a - LR * b, q, g)

    state = {"q": {k: jnp.asarray(v) for k, v in p.items()}}
    x, y = data(name)
    x, y = jnp.asarray(x), jnp.asarray(y)

    def step():
        loss, state["q"] = train(state["q"], x, y)
        return loss.block_until_ready()

    return step


def gemm_floor(name: str, p: dict):
    """Only the matmuls of an MLP step (forward, input gradients but the first layer's,
    weight gradients), in numpy's BLAS: no step built on that BLAS can beat this."""
    x, _ = data(name)
    ws = [p[f"w{i}"] for i in range(len(p) // 2)]
    acts = [x] + [np.ones((len(x), w.shape[1]), np.float32) for w in ws]

    def step():
        for a, w in zip(acts, ws):
            a @ w
        grad = acts[-1]
        for i in range(len(ws) - 1, -1, -1):
            acts[i].T @ grad
            if i:
                grad = grad @ ws[i].T

    return step


def numpy_subprocess(name: str) -> float | None:
    """The numpy step's median time in a fresh process with OPENBLAS_CORETYPE and
    OPENBLAS_L2_SIZE unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE",
                                                             "OPENBLAS_L2_SIZE")}
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import run; "
            f"print(run.numpy_time({name!r}))")
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=600, check=True).stdout
        return float(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError):
        return None


def numpy_time(name: str) -> float:
    step = numpy_step(name, init_params(name))
    x, y = data(name)
    t1 = median_time(lambda: step(x, y), 3)
    return median_time(lambda: step(x, y), calls_for(t1, 0.1))


def bench_steps(rows: list, names) -> None:
    for name in names:
        _one_step(rows, name)


def _one_step(rows: list, name: str) -> None:
    step, first = ember_step(name)
    x, y = data(name)
    t1 = median_time(lambda: step(x, y), 3)
    number = calls_for(t1, 0.1)
    exe = step._last.run
    args, params = _bound_arguments(step, x, y)
    kernels = exe.kernel_timer(args, params)
    # the call path: the step, its native call and its kernels alone in interleaved blocks
    # of their own, before the other contenders run (their threads, OpenMP's and
    # OpenBLAS's, spin on after a block and slow ember's pool); interleaved, since a single
    # profile's kernel time moves by 20% from one block to the next on a shared VM; each
    # call timed on its own, so that the step's and the call's medians compare with the
    # kernels' (medians of the cycle counter's spans)
    path = interleaved({"ember": lambda: step(x, y), "native call": exe.bound(args, params),
                        "kernels": kernels}, number, per_call=True)
    t_kernels = sum(t for _, t in kernels.seconds())
    t_python = python_path(step, x, y, number)
    others = [("numpy (here)", lambda: numpy_step(name, init_params(name)))]
    try:
        import torch  # noqa: F401

        others += [("torch eager", lambda: torch_step(name, init_params(name), False)),
                   ("torch.compile", lambda: torch_step(name, init_params(name), True))]
    except ImportError:
        pass
    try:
        import jax  # noqa: F401

        others.append(("jax jit", lambda: jax_step(name, init_params(name))))
    except ImportError:
        pass
    if name.startswith("mlp"):
        others.append(("numpy GEMMs alone (floor)", lambda: gemm_floor(name, init_params(name))))
    fns, failed = {"ember": lambda: step(x, y)}, []
    for label2, make in others:
        try:
            fn = make()
            if label2 == "numpy (here)":
                fn = (lambda f: lambda: f(x, y))(fn)
            median_time(fn, 1, 3)  # warm up (and compile)
            fns[label2] = fn
        except Exception as e:  # noqa: BLE001  (a failing baseline is reported, not fatal)
            failed.append((f"  vs {label2}", f"failed: {type(e).__name__}", "", "", ""))
    times = interleaved(fns, number)
    t_em = times.pop("ember")
    t_step, t_call = path["ember"], path["native call"]
    label = {"mlp-small": "MLP 64-128-10 b64", "mlp-large": "MLP 784-512-512-10 b128",
             "cnn": "digits CNN b64"}[name]
    rows.append((f"step {label} ember", f"{t_em * 1e6:9.1f} us",
                 f"kernels {t_kernels * 1e6:.0f} us", f"{len(exe.plan.steps)} kernels",
                 f"compile {first:.2f} s"))
    rows.append(("  its call path (Python)", f"{t_python * 1e6:9.1f} us",
                 f"step {t_step * 1e6:.0f} / call {t_call * 1e6:.0f} us",
                 f"x{t_step / t_call:5.2f} native",
                 f"x{t_step / t_kernels:5.2f} kernels"))
    for label2, t in times.items():
        rows.append((f"  vs {label2}", f"{t * 1e6:9.1f} us", f"x{t / t_em:5.2f}", "", ""))
    rows += failed
    t = numpy_subprocess(name)
    if t:
        rows.append(("  vs numpy (OPENBLAS_* unset)", f"{t * 1e6:9.1f} us",
                     f"x{t / t_em:5.2f}", "", ""))


def _bound_arguments(step, *inputs) -> tuple[list, dict]:
    """The arguments and param values the step's last compiled graph runs on, as the step
    binds them: what its native call alone is timed and profiled with."""
    entry, table = step._last, step.param_table()
    return (step.arguments(entry, inputs) + step.extra_inputs(entry, table),
            step.params(table))


def bench_compile(rows: list) -> None:
    """First compile (empty cache) and a second process's compile of the same step."""
    here = str(Path(__file__).parent)
    code = (f"import sys, json, time; sys.path.insert(0, {here!r}); import run; "
            "s, first = run.ember_step('mlp-small'); e = s._last.run; "
            "print(json.dumps({'first': first, 'cached': e.cached, "
            "'backend': e.timings}))")
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "EMBER_CACHE_DIR": d, "EMBER_CACHE": "1"}
        res = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, timeout=600, check=True).stdout
            res.append(json.loads(out.strip().splitlines()[-1]))
    for label, r in zip(("first", "cached"), res):
        stages = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in r["backend"].items()
                           if k != "total")
        rows.append((f"compile MLP step ({label})", f"{r['first'] * 1e3:9.0f} ms",
                     f"backend {r['backend']['total'] * 1e3:.0f} ms", stages[:60], ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="sgemm,eltwise,steps,gpt,cnn,compile")
    ap.add_argument("--steps", default="mlp-small,mlp-large,cnn")
    ap.add_argument("--gpt", default="A64,B128,A256", help="GPT config and T of each row")
    ap.add_argument("--precision", default="32", help="each GPT row's precisions: 32, "
                    "bf16-mixed")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        timing.REPEAT = 3
    m = machine()
    print(f"# {platform.node()} {m['cpu']}: {m['vector_bits']}-bit vectors, FMA {m['fma']}, "
          f"{m['cores']} cores at {m['clock_mhz']:.0f} MHz (measured FMA throughput; "
          f"/proc/cpuinfo says {m['mhz']:.0f}): peak {m['peak_gflops']:.0f} GFLOP/s")
    print(f"# numpy {np.__version__}: {blas_info()}; OPENBLAS env {m['env']}")
    print(f"# load average {os.getloadavg() if hasattr(os, 'getloadavg') else '?'}")
    rows: list = []
    only = args.only.split(",")
    if "sgemm" in only:
        bench_sgemm(rows, m["peak_gflops"])
        bench_bf16_gemm(rows)
    if "eltwise" in only:
        bench_eltwise(rows)
    if "steps" in only:
        bench_steps(rows, args.steps.split(","))
    if "gpt" in only:
        bench_gpt(rows, args.gpt.split(","), args.precision.split(","))
    if "cnn" in only:
        bench_cnn(rows, m["peak_gflops"], m["cores"] or os.cpu_count() or 1)
    if "compile" in only:
        bench_compile(rows)
    for r in rows:
        print(f"{r[0]:34s} {r[1]:>16s}  {r[2]:>18s}  {r[3]:>14s}  {r[4]}")


if __name__ == "__main__":
    main()
