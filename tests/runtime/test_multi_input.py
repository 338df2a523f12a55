"""Multi-input training (`n_inputs=k`): a call's first k arguments go to the model, the rest
to the loss function, in compiled steps, gradients, symbolic dims and data-parallel steps;
a batch-size mismatch names the argument.

Run as a script under torchrun, this file is also one rank of the two-rank test: it trains
on its shard and writes its final params to OUT/rank<r>.npz."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ember as em
from ember import nn, optim

D, H, C, V = 6, 8, 3, 11  # features, hidden, classes, vocabulary
CE = nn.functional.cross_entropy


class MaskedPool(nn.Module):
    """Masked mean pooling of Linear features over T, then a head: forward(x, mask)."""

    def __init__(self):
        super().__init__()
        self.lin, self.head = nn.Linear(D, H), nn.Linear(H, C)

    def forward(self, x, mask):
        b, t, _ = x.shape
        h = nn.functional.relu(self.lin(x)) * mask.reshape(b, t, 1)
        return self.head(h.sum(1) / mask.sum(1, keepdims=True))


class Tagger(nn.Module):
    """Per-token logits from tokens and an attention mask: each token's features plus the
    masked mean of all of them, forward(tokens, mask) -> [B, T, C]."""

    def __init__(self):
        super().__init__()
        self.emb, self.lin, self.head = nn.Embedding(V, D), nn.Linear(D, H), nn.Linear(H, C)

    def forward(self, tokens, mask):
        b, t = tokens.shape
        m = mask.reshape(b, t, 1)
        h = nn.functional.relu(self.lin(self.emb(tokens)))
        return self.head(h + (h * m).sum(1, keepdims=True) / m.sum(1, keepdims=True))


def tag_loss(logits, y):
    b, t, c = logits.shape
    return CE(logits.reshape(b * t, c), y.reshape(b * t))


def batch(i: int, b: int = 8, t: int = 5, dtype=np.float64) -> tuple:
    """(x, mask, y): features, a 0/1 mask with at least one 1 per row, class labels."""
    rng = np.random.default_rng(i)
    mask = (rng.random((b, t)) < 0.6).astype(dtype)
    mask[:, 0] = 1
    return rng.standard_normal((b, t, D)).astype(dtype), mask, rng.integers(0, C, b)


def tag_batch(i: int, t: int, b: int = 3) -> tuple:
    """(tokens, mask, targets) of length t."""
    rng = np.random.default_rng(100 + i)
    mask = (rng.random((b, t)) < 0.7).astype(np.float32)
    mask[:, 0] = 1
    return rng.integers(0, V, (b, t)), mask, rng.integers(0, C, (b, t))


def float64_pool(seed: int = 0) -> tuple[MaskedPool, dict]:
    """A MaskedPool with float64 params (from the seed), and those params as arrays."""
    rng = np.random.default_rng(seed)
    p = {"lin.weight": rng.standard_normal((D, H)) / 2, "lin.bias": rng.standard_normal(H) / 4,
         "head.weight": rng.standard_normal((H, C)) / 2, "head.bias": rng.standard_normal(C) / 4}
    model = MaskedPool()
    model.lin.weight, model.lin.bias = map(em.Param.from_array, (p["lin.weight"], p["lin.bias"]))
    model.head.weight, model.head.bias = map(em.Param.from_array,
                                             (p["head.weight"], p["head.bias"]))
    return model, p


def numpy_loss(p: dict, x, mask, y) -> float:
    """MaskedPool and cross-entropy in numpy (float64): the finite differences' function."""
    h = np.maximum(x @ p["lin.weight"] + p["lin.bias"], 0) * mask[..., None]
    logits = h.sum(1) / mask.sum(1, keepdims=True) @ p["head.weight"] + p["head.bias"]
    top = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(1)) + top[:, 0]
    return float((lse - logits[np.arange(len(y)), y]).mean())


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_two_input_model_trains_as_pytorch_does(backend):
    """step(x, mask, y) with n_inputs=2: model(x, mask), loss_fn(out, y); ten SGD steps
    with momentum, in float64, give PyTorch's losses and params."""
    torch = pytest.importorskip("torch")
    model, p = float64_pool()
    step = em.compile_train_step(model, CE, optim.SGD(lr=0.2, momentum=0.9), backend=backend,
                                 n_inputs=2)

    class TorchPool(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.head = torch.nn.Linear(D, H).double(), torch.nn.Linear(H, C).double()

        def forward(self, x, mask):
            h = torch.relu(self.lin(x)) * mask[..., None]
            return self.head(h.sum(1) / mask.sum(1, keepdim=True))

    tmodel = TorchPool()
    with torch.no_grad():
        for path, tp in tmodel.named_parameters():
            tp.copy_(torch.from_numpy(p[path].T.copy() if path.endswith("weight") else p[path]))
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.2, momentum=0.9)
    losses, want = [], []
    for i in range(10):
        x, mask, y = batch(i)
        losses.append(step(x, mask, y))
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tmodel(torch.from_numpy(x),
                                                        torch.from_numpy(mask)),
                                                 torch.from_numpy(y))
        loss.backward()
        topt.step()
        want.append(loss.item())
    np.testing.assert_allclose(losses, want, rtol=1e-10)
    assert losses[-1] < losses[0]
    got = dict(model.named_parameters())
    for path, tp in tmodel.named_parameters():
        t = tp.detach().numpy()
        np.testing.assert_allclose(got[path].val(), t.T if path.endswith("weight") else t,
                                   rtol=1e-9, atol=1e-12, err_msg=path)


def test_grad_of_a_two_input_model_equals_finite_differences():
    model, p = float64_pool(seed=1)
    grads = em.compile_grad(model, CE, backend="cpu", n_inputs=2)
    x, mask, y = batch(3)
    got = grads(x, mask, y)
    eps = 1e-6
    for path, param in model.named_parameters():
        want = np.zeros_like(p[path])
        for k in np.ndindex(want.shape):
            up, down = ({**p, path: p[path].copy()} for _ in range(2))
            up[path][k] += eps
            down[path][k] -= eps
            want[k] = (numpy_loss(up, x, mask, y) - numpy_loss(down, x, mask, y)) / (2 * eps)
        np.testing.assert_allclose(got[param.id], want, rtol=1e-6, atol=1e-9, err_msg=path)


def test_tokens_and_mask_with_a_symbolic_length_train_as_exact_shapes():
    """dynamic_dims over all three arguments (tokens, mask, targets): each length pads to
    its bucket, and losses and params equal a fixed-shape step's at each length."""
    em.seed(3)
    padded = Tagger()
    exact = padded.clone()
    dims = {0: {1: "T"}, 1: {1: "T"}, 2: {1: "T"}}
    step = em.compile_train_step(padded, tag_loss, optim.SGD(lr=0.5, momentum=0.9),
                                 dynamic_dims=dims, n_inputs=2)
    ref = em.compile_train_step(exact, tag_loss, optim.SGD(lr=0.5, momentum=0.9), n_inputs=2)
    for i, t in enumerate((5, 13, 7)):
        tokens, mask, y = tag_batch(i, t)
        np.testing.assert_allclose(step(tokens, mask, y), ref(tokens, mask, y), rtol=1e-5)
    got, want = padded.state_dict(), exact.state_dict()
    for path in want:
        np.testing.assert_allclose(got[path], want[path], rtol=1e-5, atol=1e-6, err_msg=path)
    assert step.compiles == 2  # buckets 8 and 16


def test_one_rank_data_parallel_step_with_two_inputs_equals_the_fused_step():
    """world_size 1: the split step (gradients, flat buffer, update graph) with n_inputs=2
    gives what the fused step gives."""
    finals = []
    for dp in (False, em.distributed.Communicator()):
        model, _ = float64_pool()
        step = em.compile_train_step(model, CE, optim.Adam(lr=1e-2), data_parallel=dp,
                                     n_inputs=2)
        losses = [step(*batch(i)) for i in range(4)]
        finals.append((losses, [p.val().copy() for _, p in model.named_parameters()]))
    (l0, p0), (l1, p1) = finals
    np.testing.assert_allclose(l0, l1, rtol=1e-12)
    for a, b in zip(p0, p1):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


STEPS, GLOBAL_BATCH = 6, 16


def train_shards(comm, rank: int, world_size: int, seed: int) -> MaskedPool:
    """`STEPS` Adam steps of a (float32) MaskedPool, each on this rank's rows of the global
    batch; with world_size 1, the single-process reference."""
    em.seed(seed)
    model = MaskedPool()
    step = em.compile_train_step(model, CE, optim.Adam(lr=1e-2), data_parallel=comm,
                                 n_inputs=2)
    shard = GLOBAL_BATCH // world_size
    rows = slice(rank * shard, (rank + 1) * shard)
    for i in range(STEPS):
        x, mask, y = batch(i, b=GLOBAL_BATCH, dtype=np.float32)
        step(x[rows], mask[rows], y[rows])
    return model


@pytest.mark.slow  # two worker processes (~5 s)
def test_two_gloo_ranks_with_two_inputs_equal_single_process(tmp_path):
    pytest.importorskip("torch.distributed")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EMBER_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", __file__, "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    r0, r1 = (np.load(tmp_path / f"rank{r}.npz") for r in (0, 1))
    ref = train_shards(em.distributed.Communicator(), 0, 1, seed=0)  # rank 0's seed
    for path, p in ref.named_parameters():
        assert np.array_equal(r0[path], r1[path]), f"replicas differ at {path}"
        np.testing.assert_allclose(r0[path], p.val(), rtol=1e-5, atol=1e-6, err_msg=path)


def test_a_batch_size_mismatch_names_the_argument_its_role_and_both_sizes():
    em.seed(0)
    model = MaskedPool()
    step = em.compile_train_step(model, CE, optim.SGD(lr=0.1), n_inputs=2)
    x, mask, y = batch(0, dtype=np.float32)
    with pytest.raises(ValueError, match=r"argument 1 \(model input 1\) has 6, but argument 0 "
                                         r"\(model input 0\) has 8"):
        step(x, mask[:6], y)
    with pytest.raises(ValueError, match=r"argument 2 \(loss argument 0\) has 5, but argument 0 "
                                         r"\(model input 0\) has 8"):
        step(x, mask, y[:5])
    grads = em.compile_grad(model, CE, n_inputs=2)
    with pytest.raises(ValueError, match=r"argument 1 \(model input 1\) has 7, argument 2 "
                                         r"\(loss argument 0\) has 7, but argument 0"):
        grads(x, mask[:7], y[:7])
    assert step.compiles == 0 and grads.compiles == 0  # refused before tracing
    assert np.isfinite(step(x, mask, y))
    assert "n_inputs=2" in repr(step)


def test_bad_n_inputs_is_a_clear_error():
    em.seed(0)
    model = MaskedPool()
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"n_inputs must be at least 1.*got {bad}"):
            em.compile_train_step(model, CE, optim.SGD(lr=0.1), n_inputs=bad)
        with pytest.raises(ValueError, match="n_inputs must be at least 1"):
            em.compile_grad(model, CE, n_inputs=bad)
    with pytest.raises(TypeError, match="n_inputs must be an int"):
        em.compile_train_step(model, CE, optim.SGD(lr=0.1), n_inputs="2")
    x, mask, _ = batch(0, dtype=np.float32)
    step = em.compile_train_step(model, CE, optim.SGD(lr=0.1), n_inputs=3)
    with pytest.raises(ValueError, match=r"n_inputs=3: the model takes the first 3 arguments "
                                         r"of each call .* but the call passes 2"):
        step(x, mask)
    padded = em.compile_train_step(model, CE, optim.SGD(lr=0.1), n_inputs=3,
                                   dynamic_dims={0: {1: "T"}, 1: {1: "T"}})
    with pytest.raises(ValueError, match="but the call passes 2"):  # not counting lengths
        padded(x, mask)


def test_all_arguments_may_go_to_the_model():
    """n_inputs equal to the number of arguments: loss_fn(out) alone."""
    em.seed(0)
    model = MaskedPool()
    step = em.compile_train_step(model, lambda out: (out * out).mean(), optim.SGD(lr=0.1),
                                 n_inputs=2)
    x, mask, _ = batch(0, dtype=np.float32)
    first = step(x, mask)
    assert step(x, mask) < first


def main() -> int:
    """One rank of `test_two_gloo_ranks_with_two_inputs_equal_single_process`."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with em.distributed.init(timeout=60.0) as comm:
        model = train_shards(comm, comm.rank, comm.world_size, seed=comm.rank)
        np.savez(Path(args.out) / f"rank{comm.rank}.npz",
                 **{path: p.val() for path, p in model.named_parameters()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
