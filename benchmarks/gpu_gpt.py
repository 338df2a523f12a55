"""The char-level GPT (benchmarks/gpt.py) trained on the GPU: losses of ember's cuda step
against ember's cpu step and PyTorch's CUDA twin from the same weights, then ms per AdamW
step of each. It exercises what the op-level GPU tests do not: a whole transformer step
with fused attention, batched matmuls with broadcast weights and the in-place arena.

Run: `python benchmarks/gpu_gpt.py [--config A] [--steps 20]` on a machine with a GPU and
cupy (torch with CUDA optional: without it the torch rows are left out).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpt import CONFIGS, Gpt, batches, lm_loss, torch_loss, torch_twin  # noqa: E402
from gpu_bench import timed, usable_gpu  # noqa: E402  (timed syncs torch's work too)

LR = 1e-3
SHAPES = {"A": (16, 64), "B": (16, 128)}  # config: batch, T


def ember_losses(config: str, data, backend: str):
    """(losses of len(data) AdamW steps, the step) on `backend`, from em.seed(0)'s weights."""
    import ember as em
    from ember import optim

    em.seed(0)
    model = Gpt(**CONFIGS[config], block=data[0][0].shape[1])
    step = em.compile_train_step(model, lm_loss, optim.AdamW(lr=LR), backend=backend)
    return [float(step(x, y)) for x, y in data], step


def torch_losses(config: str, data):
    import torch

    import ember as em

    em.seed(0)
    twin = torch_twin(Gpt(**CONFIGS[config], block=data[0][0].shape[1])).cuda()
    opt = torch.optim.AdamW(twin.parameters(), lr=LR, weight_decay=0.01)
    tensors = [(torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()) for x, y in data]

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch_loss(twin, x, y)
        loss.backward()
        opt.step()
        return loss

    return [step(x, y).item() for x, y in tensors], (lambda: step(*tensors[0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="A", choices=sorted(CONFIGS))
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    if not usable_gpu("gpu_gpt"):
        return 2
    batch, t = SHAPES[args.config]
    data = batches(65, batch, t, args.steps)
    started = time.perf_counter()
    gpu, gpu_step = ember_losses(args.config, data, "cuda")
    print(f"ember cuda: compiled and ran {args.steps} steps in "
          f"{time.perf_counter() - started:.1f} s")
    cpu, _ = ember_losses(args.config, data, "cpu")
    rows = [("ember cpu", cpu)]
    try:
        import torch

        if torch.cuda.is_available():
            theirs, torch_step = torch_losses(args.config, data)
            rows.append(("torch cuda", theirs))
        else:
            torch_step = None
    except ImportError:
        torch_step = None
    print(f"GPT {args.config} (batch {batch}, T {t}), AdamW lr {LR}: ember cuda losses "
          f"{gpu[0]:.6f} -> {gpu[-1]:.6f}")
    worst = 0.0
    for name, losses in rows:
        diff = max(abs(a - b) for a, b in zip(gpu, losses))
        worst = max(worst, diff)
        print(f"  max |ember cuda - {name}| over {args.steps} steps: {diff:.2e}")
    x, y = data[0]
    print(f"  ember cuda step: {timed(lambda: gpu_step(x, y), 50)[1]:.3f} ms")
    if torch_step is not None:
        print(f"  torch cuda eager step: {timed(torch_step, 50)[1]:.3f} ms")
    ok = all(np.isfinite(gpu)) and worst < 1e-3
    print("parity:", "ok" if ok else "FAILED (max difference above 1e-3)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
