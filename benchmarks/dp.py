"""Data-parallel scaling: ember's training step on 1 and 2 processes of one thread each.

Run: `python benchmarks/dp.py` (`--quick`: fewer steps). Rows, per model:
- 1 process, the fused step (what `compile_train_step` compiles without data_parallel),
  batch B;
- 1 process, the data-parallel step with a local communicator (the split step's own
  cost: gradient graph, flat buffer, update graph), batch B;
- 2 processes under torchrun (gloo), batch B per rank: the global batch is 2B;
- the same with `shard_optimizer=True` (ZeRO-1: reduce-scatter, update of half the params,
  all-gather);
- 2 processes under mpiexec (mpi4py), where mpiexec and mpi4py are installed;
- 2 fused steps in 2 independent processes at once, batch B each: no communication, so
  their scaling is the most this machine gives two processes (on a VM the two vCPUs may
  share a core or memory bandwidth); read the data-parallel rows against it.
Columns: median step time, global samples/s, scaling efficiency (samples/s over twice
the fused 1-process figure), time per step spent in collectives, bytes they moved per
step, and the optimizer state (AdamW's moments) held by rank 0.
Models: the large MLP (784-512-512-10, B 128) and "GPT A" (a char-level GPT: 2 layers,
n_embd 64, 4 heads, T 64, vocab 65, B 16, as issue 15 defines it); not in the default
`--models` (minutes): `gpt2`, issue 36's GPT-2-small body (benchmarks/memory.py's: 12
layers, n_embd 768, T 256; B 2 per process, 4 timed steps after 2 untimed).
The data-parallel step reduces each 25 MiB bucket of gradients while the backward computes
the next (passes/bucket_grads.py): the collectives column is the time the update waited
for them, not their length.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from gpt import Gpt, lm_loss

import ember as em
from ember import nn, optim
from ember.runtime.distributed import Communicator, Pending


def workload(name: str, rank: int):
    """(model, loss_fn, batch (x, y)) of one rank."""
    rng = np.random.default_rng(rank)
    if name == "mlp-large":
        m = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
        return m, nn.functional.cross_entropy, (
            rng.standard_normal((128, 784)).astype(np.float32), rng.integers(0, 10, 128))
    if name == "gpt2":
        x = rng.integers(0, 65, (2, 256))
        return (Gpt(vocab=65, n_embd=768, n_head=12, n_layer=12, block=256), lm_loss,
                (x, np.roll(x, -1, axis=1)))
    x = rng.integers(0, 65, (16, 64))
    return (Gpt(vocab=65, n_embd=64, n_head=4, n_layer=2, block=64), lm_loss,
            (x, np.roll(x, -1, axis=1)))


class Timed(Communicator):
    """A communicator that times its collectives (and counts their bytes)."""

    def __init__(self, inner: Communicator):
        self.inner, self.backend = inner, inner.backend
        self.rank, self.world_size = inner.rank, inner.world_size
        self.seconds, self.bytes, self.calls = 0.0, 0, 0

    def _timed(self, run, array):
        t = time.perf_counter()
        run()
        self.seconds += time.perf_counter() - t
        self.bytes += array.nbytes
        self.calls += 1
        return array

    def allreduce_(self, array):
        return self._timed(lambda: self.inner.allreduce_(array), array)

    def _started(self, start, array):
        """Started during the backward: timed are the start and the wait for the end."""
        pending = []
        self._timed(lambda: pending.append(start()), array)

        def wait():
            t = time.perf_counter()
            pending[0].wait()
            self.seconds += time.perf_counter() - t

        return Pending(wait)

    def allreduce_start(self, array):
        return self._started(lambda: self.inner.allreduce_start(array), array)

    def reduce_scatter_start(self, array, counts):
        return self._started(lambda: self.inner.reduce_scatter_start(array, counts), array)

    def reduce_scatter_(self, array, counts):
        return self._timed(lambda: self.inner.reduce_scatter_(array, counts), array)

    def all_gather_(self, array, counts):
        return self._timed(lambda: self.inner.all_gather_(array, counts), array)

    def broadcast_(self, array, root=0):
        return self.inner.broadcast_(array, root)

    def barrier(self):
        self.inner.barrier()

    def close(self):
        self.inner.close()


def worker(name: str, mode: str, steps: int, out: str) -> None:
    """Time `steps` steps in this process (mode: fused, local, or dp under torchrun)."""
    comm = em.distributed.init("mpi" if mode == "mpi" else "auto") \
        if mode in ("dp", "shard", "mpi") else Communicator()
    timed = Timed(comm)
    em.seed(0)
    model, loss_fn, (x, y) = workload(name, comm.rank)
    opt = optim.AdamW(lr=1e-3)
    step = em.compile_train_step(model, loss_fn, opt,
                                 data_parallel=False if mode == "fused" else timed,
                                 shard_optimizer=mode == "shard")
    for _ in range(2 if name == "gpt2" else 5):  # compile and warm up
        step(x, y)
    timed.seconds, timed.bytes, timed.calls = 0.0, 0, 0
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t)
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump({"step": statistics.median(times), "batch": len(x) * comm.world_size,
                       "allreduce": timed.seconds / steps,
                       "bytes": timed.bytes // steps if timed.calls else 0,
                       "state": sum(a.nbytes for slots in opt.state.values()
                                    for a in slots.values())}, f)
    comm.close()


def measure(name: str, mode: str, steps: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EMBER_NUM_THREADS": "1",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        args = [sys.executable, __file__, "--worker", name, mode, str(steps), out]
        if mode == "pair":  # two fused steps at once, the slower one counts
            outs = [out + str(k) for k in range(2)]
            runs = [subprocess.Popen([*args[:-3], "fused", str(steps), o], env=env)
                    for o in outs]
            if any([r.wait() for r in runs]):
                raise RuntimeError(f"a {name} worker of the pair failed")
            results = [_result(o) for o in outs]
            slow = max(results, key=lambda r: r["step"])
            return {**slow, "batch": 2 * slow["batch"]}
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node=2"]
        launch = {"dp": torchrun, "shard": torchrun,
                  "mpi": ["mpiexec", "--oversubscribe", "-n", "2"]}
        cmd = launch.get(mode, []) + (args[1:] if mode in ("dp", "shard") else args)
        subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        return _result(out)


def _result(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default="mlp-large,gpt-a")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        name, mode, steps, out = args.worker
        worker(name, mode, int(steps), out)
        return
    default = 20 if args.quick else 100
    print(f"{'model':10} {'processes':22} {'step ms':>8} {'samples/s':>10} {'scaling':>8} "
          f"{'collect. ms':>12} {'MB/step':>8} {'state MB':>9}")
    for name in args.models.split(","):
        base = None
        modes = [("fused", "1 (fused step)"), ("local", "1 (data-parallel step)"),
                 ("dp", "2 (gloo, torchrun)"), ("shard", "2 (gloo, sharded)")]
        if shutil.which("mpiexec") and importlib.util.find_spec("mpi4py"):
            modes.append(("mpi", "2 (mpi4py, mpiexec)"))
        modes.append(("pair", "2 fused, independent"))
        steps = 4 if name == "gpt2" else default
        for mode, label in modes:
            r = measure(name, mode, steps)
            rate = r["batch"] / r["step"]
            base = base or rate
            scaling = rate / (base * (2 if mode in ("dp", "shard", "mpi", "pair") else 1))
            print(f"{name:10} {label:22} {r['step'] * 1e3:8.2f} {rate:10,.1f} {scaling:8.2f} "
                  f"{r['allreduce'] * 1e3:12.2f} {r['bytes'] / 2**20:8.2f} "
                  f"{r['state'] / 2**20:9.2f}")


if __name__ == "__main__":
    main()
