"""The char-level GPT that benchmarks/run.py times trains exactly as its PyTorch twin does:
config A (n_embd 64, 4 heads, 2 layers; T 16, batch 4 to stay quick), identical initial
weights, 100 AdamW steps in f32, every loss within 1e-5 of PyTorch's."""

import sys
from pathlib import Path

import pytest

import ember as em
from ember import optim

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpt import CONFIGS, Gpt, batches, lm_loss, torch_loss, torch_twin  # noqa: E402

STEPS, T, BATCH, LR = 100, 16, 4, 3e-3


def test_gpt_a_losses_follow_pytorch_for_100_adamw_steps():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    em.seed(0)
    model = Gpt(vocab=65, n_head=4, block=T, **CONFIGS["A"])
    twin = torch_twin(model)
    step = em.compile_train_step(model, lm_loss, optim.AdamW(lr=LR), backend="cpu")
    opt = torch.optim.AdamW(twin.parameters(), lr=LR)
    ours, theirs = [], []
    for x, y in batches(65, BATCH, T, STEPS):
        ours.append(step(x, y))
        opt.zero_grad(set_to_none=True)
        loss = torch_loss(twin, torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    worst = max(abs(a - b) for a, b in zip(ours, theirs))
    assert worst < 1e-5, f"largest loss difference {worst:.2e}"
    assert ours[-1] < ours[0] - 0.1  # it learned something (random text: barely)
