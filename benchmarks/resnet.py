"""ResNet-18 training step (CIFAR stem, ReLU, 32x32, SGD with momentum) in ember against
PyTorch eager and torch.compile (each with its own initialization: the time does not
depend on the values), timed interleaved in one process: issue 34's CNN row. Also as a %
of the FMA peak the machine measures (benchmarks/timing.py), counting the convolutions'
and the head's multiply-adds.

Run: `python benchmarks/resnet.py [--batch 32] [--size 32]`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from timing import calls_for, interleaved, machine, median_time, torch_train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from resnet18 import WIDTHS, ResNet18, torch_resnet18  # noqa: E402  (tests/resnet18.py)

LR, MOMENTUM = 0.05, 0.9


def conv_flops(batch: int, size: int) -> float:
    """Multiply-adds x 2 of one training step: forward, and the input and weight gradients
    (each as many as the forward), the first conv's input gradient excepted."""
    c, s = 64, size
    first = 2 * 3 * 9 * 64 * s * s
    fwd = first
    for i, w in enumerate(WIDTHS):
        stride = 1 if i == 0 else 2
        s //= stride
        fwd += 2 * c * 9 * w * s * s + 2 * w * 9 * w * s * s  # block 1
        if stride != 1 or c != w:
            fwd += 2 * c * w * s * s
        fwd += 2 * 2 * w * 9 * w * s * s  # block 2
        c = w
    fwd += 2 * 512 * 10
    return batch * (3 * fwd - first)


def step_times(batch: int, size: int) -> dict:
    """Median seconds of the training step: ember's, PyTorch eager's and torch.compile's,
    timed interleaved."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch

    import ember as em
    from ember import nn, optim

    em.seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    model = ResNet18("cifar", act="relu")
    step = em.compile_train_step(model, nn.functional.cross_entropy,
                                 optim.SGD(lr=LR, momentum=MOMENTUM))
    step(x, y)
    fns = {"ember": lambda: step(x, y)}
    for label, compile_ in (("torch eager", False), ("torch.compile", True)):
        twin = torch_resnet18("cifar", act="relu")
        opt = torch.optim.SGD(twin.parameters(), lr=LR, momentum=MOMENTUM)
        fns[label] = torch_train(lambda a, b, twin=twin: torch.nn.functional.cross_entropy(
            twin(a), b), opt, compile_, x, y)
        median_time(fns[label], 1, 2)  # warm up (and compile)
    return interleaved(fns, calls_for(median_time(fns["ember"], 1, 2), 0.5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=32)
    args = ap.parse_args()
    m = machine()
    print(f"# {m['cpu']}: FMA peak {m['peak_gflops']:.0f} GFLOP/s, {m['cores']} cores")
    times = step_times(args.batch, args.size)
    flops = conv_flops(args.batch, args.size)
    t_em = times.pop("ember")
    print(f"ResNet-18 {args.size}x{args.size} b{args.batch} SGD step: ember {t_em * 1e3:8.1f} ms"
          f"  ({100 * flops / t_em / 1e9 / m['peak_gflops']:.0f}% of FMA peak)")
    for label, t in times.items():
        print(f"  vs {label:14s} {t * 1e3:8.1f} ms  x{t / t_em:5.2f}")


if __name__ == "__main__":
    main()
