"""The char-level GPT (benchmarks/gpt.py) trained on the GPU: losses of ember's cuda step
against ember's cpu step and PyTorch's CUDA twin from the same weights, then ms per AdamW
step of each. It exercises what the op-level GPU tests do not: a whole transformer step
with fused attention, batched matmuls with broadcast weights and the in-place arena.

`--precision bf16-mixed` (or 16-mixed) runs every row in that policy: ember's as
`compile_train_step(..., precision=...)`, torch's forward under
`torch.autocast("cuda", dtype=...)` (16-mixed: its GradScaler too). Mixed runs agree within
2% of the loss (low precision's rounding, the issue's bar), f32 ones within 1e-3.

Run: `python benchmarks/gpu_gpt.py [--config A] [--steps 20] [--precision 32]` on a machine
with a GPU and cupy (torch with CUDA optional: without it the torch rows are left out).
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


def ember_losses(config: str, data, backend: str, precision: str):
    """(losses of len(data) AdamW steps, the step) on `backend`, from em.seed(0)'s weights."""
    import ember as em
    from ember import optim

    em.seed(0)
    model = Gpt(**CONFIGS[config], block=data[0][0].shape[1])
    step = em.compile_train_step(model, lm_loss, optim.AdamW(lr=LR), backend=backend,
                                 precision=precision)
    return [float(step(x, y)) for x, y in data], step


def torch_losses(config: str, data, precision: str):
    import torch

    import ember as em

    em.seed(0)
    twin = torch_twin(Gpt(**CONFIGS[config], block=data[0][0].shape[1])).cuda()
    opt = torch.optim.AdamW(twin.parameters(), lr=LR, weight_decay=0.01)
    tensors = [(torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()) for x, y in data]
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "16-mixed")

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch_loss(twin, x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    return [step(x, y).item() for x, y in tensors], (lambda: step(*tensors[0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="A", choices=sorted(CONFIGS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--precision", default="32", choices=("32", "bf16-mixed", "16-mixed"))
    args = ap.parse_args(argv)
    if not usable_gpu("gpu_gpt"):
        return 2
    batch, t = SHAPES[args.config]
    data = batches(65, batch, t, args.steps)
    started = time.perf_counter()
    gpu, gpu_step = ember_losses(args.config, data, "cuda", args.precision)
    print(f"ember cuda: compiled and ran {args.steps} steps in "
          f"{time.perf_counter() - started:.1f} s")
    cpu, _ = ember_losses(args.config, data, "cpu", args.precision)
    rows = [("ember cpu", cpu)]
    try:
        import torch

        if torch.cuda.is_available():
            theirs, torch_step = torch_losses(args.config, data, args.precision)
            rows.append(("torch cuda", theirs))
        else:
            torch_step = None
    except ImportError:
        torch_step = None
    print(f"GPT {args.config} (batch {batch}, T {t}), AdamW lr {LR}, precision "
          f"{args.precision}: ember cuda losses "
          f"{gpu[0]:.6f} -> {gpu[-1]:.6f}")
    worst = 0.0
    for name, losses in rows:
        diff = max(abs(a - b) for a, b in zip(gpu, losses))
        worst = max(worst, diff)
        print(f"  max |ember cuda - {name}| over {args.steps} steps: {diff:.2e}")
    x, y = data[0]
    print(f"  ember cuda step: {timed(lambda: gpu_step(x, y), 50)[1]:.3f} ms")
    if torch_step is not None:
        autocast = "" if args.precision == "32" else " autocast"
        print(f"  torch cuda eager{autocast} step: {timed(torch_step, 50)[1]:.3f} ms")
    bar = 1e-3 if args.precision == "32" else 0.02 * gpu[0]
    ok = all(np.isfinite(gpu)) and worst < bar
    print("parity:", "ok" if ok else f"FAILED (max difference above {bar:.2g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
