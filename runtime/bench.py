"""`ember bench`: one training step (forward, backward, SGD-momentum update) of each built-in
model, timed for ember and, on the same shapes and batches in the same process, for a
hand-written numpy step and (when installed) PyTorch eager and `torch.compile`.

Each implementation runs a few warm-up steps (ember's and torch.compile's compile time
is reported separately), then `steps` timed steps; the table gives the mean
ms/step, samples/s and each row's time relative to ember's (x2.00 = twice ember's time).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

LR, MOMENTUM = 0.05, 0.9


def _batches(model: str, batch_size: int, n: int = 8) -> list[tuple[np.ndarray, np.ndarray]]:
    from .data import digits

    d = digits(seed=0, image=model == "cnn")
    return [(d.x_train[i * batch_size:(i + 1) * batch_size],
             d.y_train[i * batch_size:(i + 1) * batch_size]) for i in range(n)]


# -- ember ---------------------------------------------------------------------------------

def ember_step(model: str, backend: str):
    import ember as em

    from . import optim
    from .models import load_model

    em.seed(0)
    m = load_model(model, (1, 8, 8) if model == "cnn" else (64,), 10)
    step = em.compile_train_step(m, em.nn.functional.cross_entropy,
                                 optim.SGD(lr=LR, momentum=MOMENTUM), backend=backend)
    return step, m


# -- numpy, by hand --------------------------------------------------------------------------

def _softmax_ce_grad(z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    p[np.arange(len(y)), y] -= 1
    return float(loss), p / len(y)


class _Sgd:
    def __init__(self, params: list[np.ndarray]):
        self.params, self.bufs = params, [np.zeros_like(p) for p in params]

    def __call__(self, grads: list[np.ndarray]) -> None:
        for p, b, g in zip(self.params, self.bufs, grads):
            b *= MOMENTUM
            b += g
            p -= LR * b


def numpy_mlp(params: dict[str, np.ndarray]) -> Callable:
    w1, b1, w2, b2 = (params[k].copy() for k in ("w1", "b1", "w2", "b2"))
    sgd = _Sgd([w1, b1, w2, b2])

    def step(x, y):
        h = x @ w1 + b1
        a = np.maximum(h, 0)
        loss, dz = _softmax_ce_grad(a @ w2 + b2, y)
        da = dz @ w2.T
        da *= h > 0
        sgd([x.T @ da, da.sum(0), a.T @ dz, dz.sum(0)])
        return loss

    return step


def numpy_cnn(params: dict[str, np.ndarray]) -> Callable:
    wc, bc, w, b = (params[k].copy() for k in ("wc", "bc", "w", "b"))
    sgd = _Sgd([wc, bc, w, b])
    c_out = wc.shape[0]

    def step(x, y):
        n, c, hh, ww = x.shape
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        cols = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
        cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(n * hh * ww, c * 9)  # [n*h*w, c*9]
        conv = cols @ wc.reshape(c_out, -1).T + bc  # [n*h*w, c_out]
        a = np.maximum(conv, 0).reshape(n, hh, ww, c_out).transpose(0, 3, 1, 2)
        r = a.reshape(n, c_out, hh // 2, 2, ww // 2, 2)
        pooled = r.max(axis=(3, 5))
        flat = pooled.reshape(n, -1)
        loss, dz = _softmax_ce_grad(flat @ w + b, y)
        dpool = (dz @ w.T).reshape(pooled.shape)
        first = (r == pooled[:, :, :, None, :, None])
        da = (first * dpool[:, :, :, None, :, None]).reshape(n, c_out, hh, ww)
        dconv = (da * (a > 0)).transpose(0, 2, 3, 1).reshape(n * hh * ww, c_out)
        sgd([(dconv.T @ cols).reshape(wc.shape), dconv.sum(0), flat.T @ dz, dz.sum(0)])
        return loss

    return step


# -- PyTorch -----------------------------------------------------------------------------------

def torch_step(model: str, params: dict[str, np.ndarray], compiled: bool):
    import torch

    if model == "mlp":
        net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                  torch.nn.Linear(128, 10))
        weights = [params["w1"].T, params["b1"], params["w2"].T, params["b2"]]
    else:
        net = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                  torch.nn.Linear(256, 10))
        weights = [params["wc"], params["bc"], params["w"].T, params["b"]]
    with torch.no_grad():
        for p, v in zip(net.parameters(), weights):
            p.copy_(torch.from_numpy(np.ascontiguousarray(v)))
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.functional.cross_entropy

    def train(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    fn = torch.compile(train) if compiled else train

    def step(x, y):
        return float(fn(torch.from_numpy(x), torch.from_numpy(y)))

    return step


# -- the table ---------------------------------------------------------------------------------

def _params(model: str, m) -> dict[str, np.ndarray]:
    """ember's initial weights, so every implementation starts from the same point."""
    if model == "mlp":
        return {"w1": m.layers[0].weight.val(), "b1": m.layers[0].bias.val(),
                "w2": m.head.weight.val(), "b2": m.head.bias.val()}
    return {"wc": m.conv.weight.val(), "bc": m.conv.bias.val(), "w": m.head.weight.val(),
            "b": m.head.bias.val()}


def _time(step: Callable, batches: list, steps: int, warmup: int = 3) -> tuple[float, float]:
    """(seconds of the first call, mean seconds per step after warm-up)."""
    start = time.perf_counter()
    step(*batches[0])
    first = time.perf_counter() - start
    for i in range(1, warmup):
        step(*batches[i % len(batches)])
    start = time.perf_counter()
    for i in range(steps):
        step(*batches[i % len(batches)])
    return first, (time.perf_counter() - start) / steps


def run(models=("mlp", "cnn"), batch_size: int = 32, steps: int = 200, backend: str = "cpu",
        torch: bool = True, torch_compile: bool = True, threads: int = 1) -> str:
    """The table as text. `threads`: PyTorch's intra-op threads (0: its default); at these
    small shapes one thread is fastest, and more spin against numpy's BLAS threads."""
    torch_note = ""
    if torch or torch_compile:
        try:
            import torch as _torch

            if threads:
                _torch.set_num_threads(threads)
            torch_note = f", torch {_torch.__version__} on {_torch.get_num_threads()} thread(s)"
        except ImportError:
            torch = torch_compile = False
    rows = []
    for model in models:
        batches = _batches(model, batch_size)
        step, m = ember_step(model, backend)
        params = {k: v.copy() for k, v in _params(model, m).items()}  # before any update
        impls = [(f"ember ({backend})", lambda s=step: s)]
        impls.append(("numpy (by hand)", lambda p=params, mo=model:
                      numpy_mlp(p) if mo == "mlp" else numpy_cnn(p)))
        if torch:
            impls.append(("torch eager", lambda p=params, mo=model: torch_step(mo, p, False)))
        if torch_compile:
            impls.append(("torch.compile", lambda p=params, mo=model: torch_step(mo, p, True)))
        base = None
        for name, make in impls:
            try:
                first, per = _time(make(), batches, steps)
            except Exception as e:  # noqa: BLE001  (a row that cannot run says why)
                rows.append((model, name, None, None, None, f"failed: {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:60]}"))
                continue
            if name.startswith("ember"):
                base = per
            compiles = name.startswith("ember") or name == "torch.compile"
            note = f"first call {first:.2f} s{' (compile)' if compiles else ''}" \
                if first > 10 * per else ""
            rows.append((model, name, per, batch_size / per, per / base if base else None,
                         note))
    head = (f"{'model':<6} {'implementation':<16} {'ms/step':>9} {'samples/s':>11} "
            f"{'vs ember':>9}  note")
    lines = [f"batch {batch_size}, {steps} timed steps, SGD momentum {MOMENTUM}{torch_note}", head,
             "-" * len(head)]
    for model, name, per, tput, ratio, note in rows:
        if per is None:
            lines.append(f"{model:<6} {name:<16} {'-':>9} {'-':>11} {'-':>9}  {note}")
        else:
            rel = "-" if ratio is None else f"x{ratio:.2f}"
            lines.append(f"{model:<6} {name:<16} {per * 1e3:9.3f} {tput:11,.0f} {rel:>9}  {note}")
    return "\n".join(lines)
