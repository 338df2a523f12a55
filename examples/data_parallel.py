"""Data-parallel training: the same script on every rank, each on its shard of the batch.

    python -m torch.distributed.run --standalone --nproc_per_node=2 examples/data_parallel.py
    python examples/data_parallel.py            # one process: the same code, no launcher

torchrun sets RANK/WORLD_SIZE; `em.distributed.init()` joins that group (one process
alone when there is none) and `data_parallel=comm` averages the gradients across ranks
before each update, so 2 ranks x 32 rows train exactly as 1 process x 64 rows.
"""

import os
import tempfile

import numpy as np

import ember as em
from ember import nn, optim
from ember.runtime.data import digits


def main() -> None:
    comm = em.distributed.init()  # "gloo" under torchrun, "mpi" under mpiexec, else "local"
    em.seed(0)  # any seed per rank would do: rank 0's params are broadcast at the first step
    data = digits(seed=0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
    loader = em.DataLoader(data.x_train, data.y_train, batch_size=32, seed=0,
                           rank=comm.rank, world_size=comm.world_size)
    step = em.compile_train_step(model, nn.functional.cross_entropy,
                                 optim.AdamW(lr=3e-3, clip_norm=1.0), data_parallel=comm)
    evaluate = em.compile(model, data.x_test)
    for epoch in range(5):
        losses = [step(x, y) for x, y in loader]  # each loss: the mean over all ranks
        if comm.rank == 0:
            accuracy = (evaluate(data.x_test).argmax(1) == data.y_test).mean()
            print(f"epoch {epoch + 1}  loss {np.mean(losses):.4f}  test acc {accuracy:.2%}  "
                  f"({comm.world_size} rank{'s' if comm.world_size > 1 else ''})")
    path = os.path.join(tempfile.gettempdir(), "ember-data-parallel.safetensors")
    step.save_checkpoint(path)  # every rank calls it; rank 0 writes, the others wait for it
    comm.close()


if __name__ == "__main__":
    main()
