"""One rank of the data-parallel tests, launched by torchrun (or mpiexec) from
test_distributed.py: trains on its shard and writes its final params to OUT/rank<r>.npz.

--case train: an MLP with LayerNorm, Adam with clipping, seeded differently per rank
  (rank 0's params are broadcast). Gradients are reduced in buckets of 1 KiB, each while
  the backward computes the next. --case batchnorm: the same with BatchNorm1d.
--case dropout: with a Dropout layer. --case syncbn: BatchNorm1d(sync=True).
--case die: rank 1 exits after 3 steps.
--case mismatch: rank 1 builds a wider model.
--case lr: rank 1 changes its learning rate after 3 steps.
--case batch: rank 1 passes a shorter batch at step 5.
--case files: each rank resumes from a checkpoint of its own (they differ).
--case f16: precision="16-mixed", one sample of the data 1e30 (it overflows f16 at the
  step whose batch holds it, on whichever rank gets it: every rank must skip that update);
  writes OUT/scaler<r>.txt (the final scale and the optimizer's step count).
--shard: ZeRO-1 (shard_optimizer=True); with --case train it also saves a checkpoint at
  step 10 and trains again from it, writing OUT/resumed<r>.npz and OUT/state<r>.txt (the
  bytes of this rank's optimizer state).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import ember as em
from ember import nn, optim
from ember.runtime.data_parallel import DataParallelStep

STEPS, BATCH = 20, 16
POISONED = 100  # the sample that overflows f16 in --case f16


def data(case: str = "train"):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((512, 20)).astype(np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int64)
    if case == "f16":
        x[POISONED] = 1e30
    return x, y


def model(case: str, hidden: int = 32) -> nn.Module:
    norm = (nn.BatchNorm1d(hidden, sync=case == "syncbn") if case in ("batchnorm", "syncbn")
            else nn.LayerNorm(hidden))
    drop = [nn.Dropout(0.3)] if case == "dropout" else []
    return nn.Sequential(nn.Linear(20, hidden), norm, nn.GELU(), *drop, nn.Linear(hidden, 10))


def train(case: str, comm, rank: int, world_size: int, steps: int = STEPS,
          batch: int = BATCH, backend: str = "cpu", seed: int = 0, shard: bool = False,
          save: tuple[int, str] | None = None, resume: str | None = None):
    """`steps` steps on this rank's shard; with world_size 1 and batch * N, the reference.
    `save`: (after how many steps, path) of a checkpoint; `resume`: a checkpoint to start
    from (its steps are skipped). `comm` None: a step without data_parallel. Returns the
    model and the step."""
    em.seed(seed)
    m = model(case, hidden=48 if case == "mismatch" and rank == 1 else 32)
    # not Adam around BatchNorm: the bias before it has a gradient of ~1e-9, rounding noise
    # that Adam's normalization turns into steps of 1e-3
    opt = (optim.SGD(lr=optim.Cosine(0.05, steps), momentum=0.9, clip_norm=0.5)
           if case in ("batchnorm", "syncbn") else
           optim.Adam(lr=optim.Cosine(3e-3, steps), clip_norm=0.5))
    step = em.compile_train_step(m, nn.functional.cross_entropy, opt, backend=backend,
                                 data_parallel=comm or False, shard_optimizer=shard,
                                 precision="16-mixed" if case == "f16" else "32")
    if resume is not None:
        step.load_checkpoint(resume)
    x, y = data(case)
    loader = em.DataLoader(x, y, batch, seed=1, rank=rank, world_size=world_size)
    done, skip = 0, opt.step_count
    while done < steps:
        for xb, yb in loader:
            if skip:  # the batches the checkpoint's steps trained on
                skip, done = skip - 1, done + 1
                continue
            if case == "die" and rank == 1 and done == 3:
                os._exit(3)
            if case == "lr" and rank == 1 and done == 3:
                opt.lr = 0.1
            if case == "batch" and rank == 1 and done == 5:
                xb, yb = xb[:-1], yb[:-1]
            step(xb, yb)
            done += 1
            if save is not None and done == save[0]:
                step.save_checkpoint(save[1])
            if done == steps:
                break
    return m, step


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="train")
    p.add_argument("--out", required=True)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--distributed", default="auto")
    p.add_argument("--shard", action="store_true")
    args = p.parse_args()
    # buckets of 1 KiB: the gradients of each layer reduced while the backward goes on
    DataParallelStep.bucket_bytes = 1024
    comm = em.distributed.init(args.distributed, timeout=float(os.environ.get("DP_TIMEOUT", 60)))
    with comm:
        r, ckpt = comm.rank, os.path.join(args.out, "step10.safetensors")
        if args.case == "files":
            _, alone = train("train", None, 0, 1, steps=1, seed=r)
            own = alone.save_checkpoint(os.path.join(args.out, f"own{r}.safetensors"))
            train("train", comm, r, comm.world_size, shard=args.shard, resume=own)
            return 0
        save = (10, ckpt) if args.shard and args.case == "train" else None
        m, step = train(args.case, comm, r, comm.world_size, backend=args.backend,
                        seed=100 + r, shard=args.shard, save=save)
        np.savez(os.path.join(args.out, f"rank{r}.npz"), **values(m))
        if step.scaler is not None:
            with open(os.path.join(args.out, f"scaler{r}.txt"), "w") as f:
                f.write(f"{step.scaler.scale} {step.optimizer.step_count}")
        if save is not None:
            state = sum(a.nbytes for slots in step.optimizer.state.values()
                        for a in slots.values())
            with open(os.path.join(args.out, f"state{r}.txt"), "w") as f:
                f.write(str(state))
            m, _ = train(args.case, comm, r, comm.world_size, backend=args.backend,
                         seed=200 + r, shard=True, resume=ckpt)
            np.savez(os.path.join(args.out, f"resumed{r}.npz"), **values(m))
    return 0


def values(m: nn.Module) -> dict[str, np.ndarray]:
    return {path: p.val() for path, p in m.all_params() if p.kind != "flag"}


if __name__ == "__main__":
    sys.exit(main())
