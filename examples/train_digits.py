"""Training with the Python API: a compiled step, an lr schedule, clipping, checkpoints.

    python examples/train_digits.py [--backend interpreter]
"""

import argparse
import os
import tempfile

import numpy as np

import ember as em
from ember import nn, optim
from ember.runtime.data import DataLoader, digits


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(self.drop(nn.functional.relu(self.fc1(x))))


def main(backend: str) -> None:
    em.seed(0)
    data = digits(seed=0)
    model = Mlp()
    loader = DataLoader(data.x_train, data.y_train, batch_size=32, seed=0)
    schedule = optim.LinearWarmup(optim.Cosine(1e-2, total_steps=8 * len(loader)),
                                  warmup_steps=20)
    step = em.compile_train_step(model, nn.functional.cross_entropy,
                                 optim.AdamW(lr=schedule, clip_norm=1.0), backend=backend)
    evaluate = em.compile(model, data.x_test, backend=backend)  # dropout off: inference
    path = os.path.join(tempfile.mkdtemp(), "run.safetensors")
    for epoch in range(8):
        losses = [step(x, y) for x, y in loader]
        accuracy = (evaluate(data.x_test).argmax(1) == data.y_test).mean()
        print(f"epoch {epoch + 1}  loss {np.mean(losses):.4f}  test acc {accuracy:.2%}  "
              f"lr {step.optimizer.lr:.2e}")
        if epoch == 3:
            step.save_checkpoint(path, {"epoch": epoch + 1})
    print("stages:", ", ".join(step.stages))
    print("memory:", step.memory_report())

    em.seed(0)  # resume the same run in a fresh model and step: it continues bit-exactly
    again = Mlp()
    step2 = em.compile_train_step(again, nn.functional.cross_entropy, optim.AdamW(),
                                  backend=backend)
    start = step2.load_checkpoint(path)["epoch"]
    loader.set_epoch(start)
    for _ in range(start, 8):
        for x, y in loader:
            step2(x, y)
    same = all(np.array_equal(p.val(), q.val())
               for p, q in zip(model.parameters(), again.parameters()))
    print(f"resumed from epoch {start}: parameters identical to the uninterrupted run: {same}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "interpreter"))
    main(parser.parse_args().backend)
