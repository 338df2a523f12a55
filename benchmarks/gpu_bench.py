"""GPU benchmark: one training step (forward, backward, SGD-momentum update) of the MLP and
the CNN of `ember train`, at the digits' size and at a wider size, for:

- ember cuda, per-op kernels and after the `fuse` pass, driven directly (params and
  optimizer state stay on the device; nothing but the loss could come back);
- ember through the runtime (`em.compile_train_step(..., backend="cuda")`), if it works;
- PyTorch CUDA eager when torch with CUDA is installed, else a cupy-written reference step.

Config "attention": the fused causal attention kernels alone (kernel.attention then
kernel.attention_grad, backends/cuda/attention.py) at batch [16, 4], T 256, D 16, against
torch's scaled_dot_product_attention forward + backward when torch has CUDA.

Run: `python benchmarks/gpu_bench.py [--steps 50]` on a machine with a GPU and cupy.
Prints the GPU, then ms/step (mean over `steps` after warm-up, synchronized) per row.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

LR, MOMENTUM = 0.05, 0.9
CONFIGS = {  # name: (model, model kwargs, input shape per sample, batch)
    "mlp-digits": ("mlp", {"d_in": 64, "hidden": (128,)}, (64,), 32),
    "mlp-wide": ("mlp", {"d_in": 784, "hidden": (1024, 1024)}, (784,), 512),
    "cnn-digits": ("cnn", {"in_shape": (1, 8, 8), "channels": 16}, (1, 8, 8), 32),
    "cnn-wide": ("cnn", {"in_shape": (3, 32, 32), "channels": 64}, (3, 32, 32), 128),
}
ATTENTION = ((16, 4), 256, 16)  # config "attention": batch, T, head dim


def make_model(kind, kwargs):
    import ember as em
    from ember.runtime.models import Cnn, Mlp

    em.seed(0)
    return (Mlp if kind == "mlp" else Cnn)(d_out=10, **kwargs)


def data(shape, batch, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, *shape)).astype(np.float32),
            rng.integers(0, 10, batch).astype(np.int64))


def usable_gpu(prog: str) -> bool:
    """Whether the cuda backend has a usable GPU here; if not, `prog` says why on stderr."""
    from ember.backends import cuda

    try:
        cuda.check_available()
    except cuda.CudaUnavailableError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return False
    return True


def sync():
    import cupy

    cupy.cuda.Device().synchronize()


def timed(step, steps, warmup=3):
    """(seconds of the first call, mean ms per step after warm-up), device-synchronized."""
    t = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t
    for _ in range(warmup):
        step()
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return first, (time.perf_counter() - t) / steps * 1e3


# -- ember, driven directly -------------------------------------------------------------------

def ember_direct(model, x, y, fused: bool):
    import cupy

    from ember import nn
    from ember.backends import cuda
    from ember.frontend.trace import TensorSpec, trace_function
    from ember.runtime import optim
    from ember.runtime.pipeline import Stages, training_pipeline

    opt = optim.SGD(lr=LR, momentum=MOMENTUM)
    g = trace_function(lambda a, b: nn.functional.cross_entropy(model(a), b), model,
                       (TensorSpec.of(x), TensorSpec.of(y)), name="train_step", training=True)
    passes = [p for p in training_pipeline(opt.pass_spec()) if p != "fuse"]
    graph = Stages(g, passes + (["fuse"] if fused else [])).graph
    exe = cuda.compile(graph)
    params = {op.attributes["id"]: cupy.asarray(model.params_by_id()[op.attributes["id"]].val())
              for op in graph.params()}
    names = [a.name for a in graph.args]
    upd = graph.attributes["ember.updates"]
    state = [cupy.zeros(a.type.shape, np.float32) for a in graph.args[names.index("step") + 1:]]
    xd, yd = cupy.asarray(x), cupy.asarray(y)
    lr = cupy.asarray(np.float32(LR))
    count = [0]

    def step():
        count[0] += 1
        outs = exe([xd, yd, lr, cupy.asarray(np.float32(count[0])), *state], params)
        params.update(zip(upd, outs[1:1 + len(upd)]))
        state[:] = outs[1 + len(upd):]
        return outs[0]

    return step, len(exe.program.kernels), len(exe.program.steps)


def ember_runtime(model, x, y):
    import ember as em
    from ember.runtime import optim

    step = em.compile_train_step(model, em.nn.functional.cross_entropy,
                                 optim.SGD(lr=LR, momentum=MOMENTUM), backend="cuda")
    return lambda: step(x, y)


# -- references --------------------------------------------------------------------------------

def torch_step(kind, kwargs, x, y):
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA here")
    if kind == "mlp":
        dims = [kwargs["d_in"], *kwargs["hidden"]]
        layers = []
        for a, b in zip(dims, dims[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        net = torch.nn.Sequential(*layers, torch.nn.Linear(dims[-1], 10))
    else:
        c, h, w = kwargs["in_shape"]
        ch = kwargs["channels"]
        net = torch.nn.Sequential(torch.nn.Conv2d(c, ch, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                  torch.nn.Linear(ch * (h // 2) * (w // 2), 10))
    net = net.cuda()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    xd, yd = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(xd), yd)
        loss.backward()
        opt.step()
        return loss

    return step


def cupy_step(kind, kwargs, x, y):
    """A hand-written cupy step (cuBLAS matmuls, cupy elementwise kernels)."""
    import cupy as cp

    rng = np.random.default_rng(0)

    def init(*shape):
        fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
        return cp.asarray(rng.uniform(-1, 1, shape).astype(np.float32) / np.sqrt(fan_in))

    xd, yd = cp.asarray(x), cp.asarray(y)
    n = len(y)

    def ce_grad(z):
        z = z - z.max(1, keepdims=True)
        e = cp.exp(z)
        p = e / e.sum(1, keepdims=True)
        loss = -cp.log(p[cp.arange(n), yd]).mean()
        p[cp.arange(n), yd] -= 1
        return loss, p / n

    if kind == "mlp":
        dims = [kwargs["d_in"], *kwargs["hidden"], 10]
        params = [t for a, b in zip(dims, dims[1:]) for t in (init(a, b), init(1, b)[0])]
    else:
        c, h, w = kwargs["in_shape"]
        ch = kwargs["channels"]
        params = [init(ch, c, 3, 3), init(1, ch)[0], init(ch * (h // 2) * (w // 2), 10),
                  init(1, 10)[0]]
    bufs = [cp.zeros_like(p) for p in params]

    def sgd(grads):
        for p, b, g in zip(params, bufs, grads):
            b *= MOMENTUM
            b += g
            p -= LR * b

    def mlp():
        acts, hs, a = [xd], [], xd
        for i in range(0, len(params) - 2, 2):
            h_ = a @ params[i] + params[i + 1]
            hs.append(h_)
            a = cp.maximum(h_, 0)
            acts.append(a)
        loss, dz = ce_grad(a @ params[-2] + params[-1])
        grads = [acts[-1].T @ dz, dz.sum(0)]
        d = dz @ params[-2].T
        for i in range(len(hs) - 1, -1, -1):
            d = d * (hs[i] > 0)
            grads = [acts[i].T @ d, d.sum(0)] + grads
            if i:
                d = d @ params[2 * i].T
        sgd(grads)
        return loss

    def cnn():
        wc, bc, wl, bl = params
        nb, c, hh, ww = xd.shape
        co = wc.shape[0]
        xp = cp.pad(xd, ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = cp.stack([xp[:, :, i:i + hh, j:j + ww] for i in range(3) for j in range(3)], 2)
        cols = cols.transpose(0, 3, 4, 1, 2).reshape(nb * hh * ww, c * 9)
        conv = cols @ wc.reshape(co, -1).T + bc
        a = cp.maximum(conv, 0).reshape(nb, hh, ww, co).transpose(0, 3, 1, 2)
        r = a.reshape(nb, co, hh // 2, 2, ww // 2, 2)
        pooled = r.max(axis=(3, 5))
        flat = pooled.reshape(nb, -1)
        loss, dz = ce_grad(flat @ wl + bl)
        dpool = (dz @ wl.T).reshape(pooled.shape)
        da = ((r == pooled[:, :, :, None, :, None]) * dpool[:, :, :, None, :, None]).reshape(
            nb, co, hh, ww)
        dconv = (da * (a > 0)).transpose(0, 2, 3, 1).reshape(nb * hh * ww, co)
        sgd([(dconv.T @ cols).reshape(wc.shape), dconv.sum(0), flat.T @ dz, dz.sum(0)])
        return loss

    return mlp if kind == "mlp" else cnn


# -- fused attention ---------------------------------------------------------------------------

def attention_step(batch, t, d):
    """ember's fused causal attention forward + backward as one graph (q, k, v, do -> o, dq,
    dk, dv), on device arrays."""
    import cupy

    from ember.backends import cuda
    from ember.backends.strides import contiguous_strides
    from ember.ir import Builder, Graph, TensorType

    shape = (*batch, t, d)
    g = Graph("attention", [TensorType(shape, "f32")] * 4)
    b = Builder(g.body)
    q, k, v, do = g.args
    m = list(contiguous_strides(shape))
    attrs = dict(batch=list(batch), sizes=[t, t, d, d], maps=[m] * 3, causal=True,
                 scale=d ** -0.5)
    o, lse = b.create("kernel.attention", [q, k, v], attrs).results
    grad_maps = [m] * 4 + [list(contiguous_strides((*batch, t))), m]
    grads = b.create("kernel.attention_grad", [q, k, v, o, lse, do],
                     dict(attrs, maps=grad_maps)).results
    b.create("func.return", [o, *grads])
    exe = cuda.compile(g)
    rng = np.random.default_rng(0)
    xs = [cupy.asarray(rng.standard_normal(shape).astype(np.float32)) for _ in range(4)]
    return (lambda: exe(xs)), len(exe.program.kernels), len(exe.program.steps)


def torch_attention_step(batch, t, d):
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA here")
    q, k, v = (torch.randn(*batch, t, d, device="cuda", requires_grad=True) for _ in range(3))
    do = torch.randn(*batch, t, d, device="cuda")

    def step():
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.autograd.grad(o, (q, k, v), do)

    return step


def attention_rows(have_torch):
    """(label, make) rows of config "attention"."""
    rows = [("ember cuda fused attention", lambda: attention_step(*ATTENTION))]
    if have_torch:
        rows.append(("torch sdpa fwd+bwd", lambda: (torch_attention_step(*ATTENTION),)))
    return rows


def implementations(kind, kwargs, x, y, have_torch):
    """(label, make) rows; make() returns (step, [kernels, steps])."""
    ref = torch_step if have_torch else cupy_step
    return [
        ("ember cuda per-op", lambda: ember_direct(make_model(kind, kwargs), x, y, False)),
        ("ember cuda fused", lambda: ember_direct(make_model(kind, kwargs), x, y, True)),
        ("ember runtime step", lambda: (ember_runtime(make_model(kind, kwargs), x, y),)),
        ("torch cuda eager" if have_torch else "cupy by hand",
         lambda: (ref(kind, kwargs, x, y),)),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--configs", default=",".join([*CONFIGS, "attention"]))
    args = ap.parse_args(argv)
    if not usable_gpu("gpu_bench"):
        return 2
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print(f"GPU: {name}, {props['multiProcessorCount']} SMs, "
          f"{props['totalGlobalMem'] / 2**30:.0f} GiB; driver "
          f"{cupy.cuda.runtime.driverGetVersion()}, runtime "
          f"{cupy.cuda.runtime.runtimeGetVersion()}, cupy {cupy.__version__}")
    try:
        import torch

        have_torch = torch.cuda.is_available()
        print(f"torch {torch.__version__}, CUDA available: {have_torch}")
    except ImportError:
        have_torch = False
        print("torch not installed: the reference is a cupy-written step")
    print(f"{'config':<12} {'implementation':<26} {'first call s':>12} {'ms/step':>9} "
          f"{'vs ember fused':>14}")
    for cfg in args.configs.split(","):
        if cfg == "attention":
            impls = attention_rows(have_torch)
        else:
            kind, kwargs, shape, batch = CONFIGS[cfg]
            impls = implementations(kind, kwargs, *data(shape, batch), have_torch)
        rows = []
        for label, make in impls:
            try:
                made = make()
                first, ms = timed(made[0], args.steps)
                extra = f" ({made[1]} kernels, {made[2]} steps)" if len(made) > 1 else ""
                rows.append((label + extra, first, ms))
            except Exception as e:  # noqa: BLE001  (a row that cannot run says why)
                rows.append((label, None, f"failed: {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:90] if str(e) else ''}"))
        base = next((r[2] for r in rows if r[0].startswith("ember cuda fused")
                     and isinstance(r[2], float)), None)
        for label, first, ms in rows:
            if isinstance(ms, float):
                rel = f"x{ms / base:.2f}" if base else ""
                print(f"{cfg:<12} {label:<26} {first:>12.2f} {ms:>9.3f} {rel:>14}")
            else:
                print(f"{cfg:<12} {label:<26} {ms}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
