"""A training run with a change made between its steps, and the reference it must equal:
what the runtime's step-key and watch tests compare."""

import ember as em
from ember import nn


def train_with_change(make_model, optimizer, batches, change=None, rebuild=False):
    """Two steps on `make_model()` (seeded), `change(model, step)`, the other batches; with
    `rebuild`, those on a new step object compiled afresh for the changed settings (the
    reference). Returns the losses, the final state dict (copied) and the last step."""
    em.seed(0)
    model = make_model()
    step = em.compile_train_step(model, nn.functional.cross_entropy, optimizer, backend="cpu")
    losses = [step(*b) for b in batches[:2]]
    if change is not None:
        change(model, step)
    if rebuild:
        step = em.compile_train_step(model, nn.functional.cross_entropy, step.optimizer,
                                     backend="cpu")
    losses += [step(*b) for b in batches[2:]]
    return losses, {k: v.copy() for k, v in model.state_dict().items()}, step
