"""Data-parallel training: real worker processes launched by torchrun (gloo) or mpiexec,
against single-process training on the global batch."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.runtime.distributed import DistributedError, detect

pytestmark = pytest.mark.slow  # real worker processes


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import dp_worker  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "EMBER_NUM_THREADS": "1", "DP_TIMEOUT": "20"}


def torchrun(case: str, out: Path, nproc: int = 2, timeout: float = 180,
             *options: str) -> subprocess.CompletedProcess:
    pytest.importorskip("torch.distributed")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", str(HERE / "dp_worker.py"), "--case", case,
           "--out", str(out), *options]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


def params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def single_process(case: str) -> dict[str, np.ndarray]:
    """The reference: one process, the global batch (2 x the per-rank batch), rank 0's seed."""
    m, _ = dp_worker.train(case, em.distributed.Communicator(), 0, 1,
                           batch=2 * dp_worker.BATCH, seed=100)
    return dp_worker.values(m)


@pytest.mark.parametrize("case", ["train", "dropout", "syncbn"])
def test_two_gloo_ranks_equal_single_process_on_the_global_batch(tmp_path, case):
    """Dropout too: each rank draws the mask of its rows of the global batch; and
    BatchNorm(sync=True) normalizes with the global batch's statistics, as one process."""
    run = torchrun(case, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    r0, r1 = params(tmp_path / "rank0.npz"), params(tmp_path / "rank1.npz")
    for k in r0:  # each rank was seeded differently: rank 0's params were broadcast
        assert np.array_equal(r0[k], r1[k]), f"replicas differ at {k}"
    ref = single_process(case)
    assert r0.keys() == ref.keys()
    for k in ref:
        np.testing.assert_allclose(r0[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_sharded_optimizer_equals_data_parallel_and_resumes_in_any_world_size(tmp_path):
    """ZeRO-1 on 2 gloo ranks (Adam with clipping: the global norm crosses the shards):
    the params equal single-process training on the global batch as unsharded ranks do,
    each rank holds about half the optimizer state, a run resumed from the checkpoint of
    step 10 ends bit-exactly where the unbroken one did, and the same file resumes in one
    process without data parallelism."""
    run = torchrun("train", tmp_path, 2, 180, "--shard")
    assert run.returncode == 0, run.stderr[-3000:]
    r0, r1 = params(tmp_path / "rank0.npz"), params(tmp_path / "rank1.npz")
    ref = single_process("train")
    for k in ref:
        assert np.array_equal(r0[k], r1[k]), f"replicas differ at {k}"
        np.testing.assert_allclose(r0[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for r in (0, 1):
        resumed = params(tmp_path / f"resumed{r}.npz")
        for k in ref:
            assert np.array_equal(resumed[k], r0[k]), f"rank {r}: resumed differs at {k}"
    held = [int((tmp_path / f"state{r}.txt").read_text()) for r in (0, 1)]
    total = 2 * sum(a.nbytes for a in ref.values())  # Adam: two moments per param
    largest = 2 * max(a.nbytes for a in ref.values())  # params are dealt whole
    assert sum(held) == total and max(held) <= total / 2 + largest / 2, held
    m, _ = dp_worker.train("train", None, 0, 1, batch=2 * dp_worker.BATCH, seed=300,
                           resume=str(tmp_path / "step10.safetensors"))
    for k, v in dp_worker.values(m).items():
        np.testing.assert_allclose(v, ref[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("shard", [False, True], ids=["replicated", "sharded"])
def test_16_mixed_ranks_skip_an_overflowing_update_together(tmp_path, shard):
    """precision="16-mixed" on 2 gloo ranks: the step whose batch holds the sample that
    overflows f16 (on one rank) is skipped on both, the scale halved on both (sharded: the
    ranks agree on it before any shard updates), and the params equal single-process
    training on the global batch, which skips that step too."""
    run = torchrun("f16", tmp_path, 2, 180, *(["--shard"] if shard else []))
    assert run.returncode == 0, run.stderr[-3000:]
    r0, r1 = params(tmp_path / "rank0.npz"), params(tmp_path / "rank1.npz")
    m, step = dp_worker.train("f16", em.distributed.Communicator(), 0, 1,
                              batch=2 * dp_worker.BATCH, seed=100)
    ref = dp_worker.values(m)
    for k in ref:  # a rank's f16 weight gradient is its half batch's sum rounded to f16
        assert np.array_equal(r0[k], r1[k]), f"replicas differ at {k}"
        np.testing.assert_allclose(r0[k], ref[k], rtol=2e-3, atol=5e-5, err_msg=k)
    scale, count = step.scaler.scale, step.optimizer.step_count
    assert scale < 2.0 ** 16 and count == dp_worker.STEPS - math.log2(2.0 ** 16 / scale)
    for r in (0, 1):
        assert (tmp_path / f"scaler{r}.txt").read_text() == f"{scale} {count}"


def test_batchnorm_buffers_are_averaged_so_replicas_stay_equal(tmp_path):
    run = torchrun("batchnorm", tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    r0, r1 = params(tmp_path / "rank0.npz"), params(tmp_path / "rank1.npz")
    assert any("running_mean" in k for k in r0)
    for k in r0:
        assert np.array_equal(r0[k], r1[k]), f"replicas differ at {k}"


def test_a_rank_that_dies_ends_the_run_with_an_error_not_a_hang(tmp_path):
    start = time.monotonic()
    run = torchrun("die", tmp_path, timeout=120)
    assert run.returncode != 0
    assert time.monotonic() - start < 100
    said = run.stdout + run.stderr
    assert "exitcode" in said or "DistributedError" in said, said[-3000:]
    assert not (tmp_path / "rank0.npz").exists()


@pytest.mark.parametrize(("case", "step"), [("lr", 4), ("batch", 6)])
def test_ranks_that_differ_later_fail_together_at_that_step(tmp_path, case, step):
    """An lr changed on one rank trained replicas that drifted apart silently; a shorter
    batch on one rank waited in mismatched collectives until the timeout, then blamed a
    dead peer. Both now fail at once, on every rank, naming the ranks."""
    start = time.monotonic()
    run = torchrun(case, tmp_path, timeout=120)
    assert run.returncode != 0 and time.monotonic() - start < 60
    assert ("the step (batch shapes, optimizer settings) differs between ranks: rank 0 "
            "and rank(s) [1]") in run.stderr, run.stderr[-3000:]
    assert not (tmp_path / "rank0.npz").exists()


def test_ranks_with_different_models_fail_together_naming_the_ranks(tmp_path):
    run = torchrun("mismatch", tmp_path, timeout=120)
    assert run.returncode != 0
    assert "the traced training graph differs between ranks: rank 0 and rank(s) [1]" \
        in run.stderr, run.stderr[-3000:]


def test_ranks_resuming_from_different_checkpoints_fail_together(tmp_path):
    run = torchrun("files", tmp_path, 2, 120, "--shard")
    assert run.returncode != 0
    assert "the checkpoint file resumed from differs between ranks: rank 0 and rank(s) [1]" \
        in run.stderr, run.stderr[-3000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_peer_that_never_joins_is_an_error_within_the_timeout():
    pytest.importorskip("torch.distributed")
    env = {**ENV, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    code = "import ember as em; em.distributed.init(timeout=3)"
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode != 0
    assert time.monotonic() - start < 45
    assert "DistributedError: rank 0 of 2 could not join the process group" in run.stderr, \
        run.stderr[-2000:]


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec on this machine")
@pytest.mark.parametrize("options", [[], ["--shard"]], ids=["replicated", "sharded"])
def test_two_mpi_ranks_equal_single_process(tmp_path, options):
    """Sharded too: MPI's Reduce_scatter and Allgatherv (uneven segments)."""
    pytest.importorskip("mpi4py")
    cmd = ["mpiexec", "-n", "2", sys.executable, str(HERE / "dp_worker.py"), "--case", "train",
           "--out", str(tmp_path), "--distributed", "mpi", *options]
    # as root (CI containers), OpenMPI wants both variables; --oversubscribe: 2 ranks on
    # machines with fewer slots
    env = {**ENV, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    r0, r1 = params(tmp_path / "rank0.npz"), params(tmp_path / "rank1.npz")
    ref = single_process("train")
    for k in ref:
        assert np.array_equal(r0[k], r1[k]), k
        np.testing.assert_allclose(r0[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("shard", [False, True], ids=["replicated", "sharded"])
def test_one_rank_16_mixed_data_parallel_step_equals_the_fused_step(shard):
    """world_size 1 under 16-mixed: the split step scales, unscales, skips an overflowing
    update (the scale forced up) and halves the scale as the fused step does."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 20)).astype(np.float32), rng.integers(0, 10, 32)
    finals = []
    for dp in (False, em.distributed.Communicator()):
        em.seed(0)
        m = dp_worker.model("train")
        opt = optim.Adam(lr=1e-2, clip_norm=0.5)
        step = em.compile_train_step(m, nn.functional.cross_entropy, opt, data_parallel=dp,
                                     shard_optimizer=shard and bool(dp), precision="16-mixed")
        trace = []
        for k in range(4):
            if k >= 2:  # the backward overflows f16, then the scale is set back
                step.scaler.scale = 2.0 ** 60 if k == 2 else 2.0 ** 16
            trace.append((step(x, y), step.skipped, step.scaler.scale, opt.step_count))
        finals.append((trace, [p.val().copy() for _, p in m.all_params()]))
    (t0, p0), (t1, p1) = finals
    assert [t[1:] for t in t0] == [t[1:] for t in t1]
    assert [t[1] for t in t0] == [False, False, True, False] and t0[2][2] == 2.0 ** 59
    np.testing.assert_allclose([t[0] for t in t0], [t[0] for t in t1], rtol=1e-6)
    for a, b in zip(p0, p1):  # f16 results: two graphs' GEMMs may round one an ulp apart
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=1e-5)


@pytest.mark.parametrize("shard", [False, True], ids=["replicated", "sharded"])
@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
@pytest.mark.parametrize("case, make_opt", [
    ("train", lambda: optim.Adam(lr=1e-2, clip_norm=0.5)),
    # not Adam: the bias before BatchNorm has a gradient of ~1e-9, rounding noise that
    # Adam's normalization turns into steps of 1e-3 (either way of computing it)
    ("batchnorm", lambda: optim.SGD(lr=0.1, momentum=0.9, clip_norm=0.5))])
def test_one_rank_data_parallel_step_equals_the_fused_step(backend, case, make_opt, shard):
    """world_size 1: the split step (gradients, flat buffer, update graph; sharded, the
    update clipped before it and the params in their arena) gives what the single fused
    training step gives."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 20)).astype(np.float32), rng.integers(0, 10, 32)
    finals = []
    for dp in (False, em.distributed.Communicator()):
        em.seed(0)
        m = dp_worker.model(case)
        opt = make_opt()
        step = em.compile_train_step(m, nn.functional.cross_entropy, opt, backend=backend,
                                     data_parallel=dp, shard_optimizer=shard and bool(dp))
        losses = [step(x, y) for _ in range(4)]
        finals.append((losses, [p.val().copy() for _, p in m.all_params()],
                       [opt.state[pid][slot].copy() for pid in sorted(opt.state, key=str)
                        for slot in sorted(opt.state[pid])]))
    (l0, p0, s0), (l1, p1, s1) = finals
    np.testing.assert_allclose(l0, l1, rtol=1e-6)
    for a, b in zip(p0 + s0, p1 + s1):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_shard_optimizer_without_data_parallel_is_a_usage_error():
    with pytest.raises(ValueError, match="pass data_parallel=True"):
        em.compile_train_step(dp_worker.model("train"), nn.functional.cross_entropy,
                              optim.AdamW(lr=1e-3), shard_optimizer=True)


def test_data_parallel_rejects_what_is_not_a_communicator():
    m = dp_worker.model("train")
    with pytest.raises(TypeError, match="data_parallel must be True, False or a Communicator"):
        em.compile_train_step(m, nn.functional.cross_entropy, optim.SGD(lr=0.1),
                              data_parallel="gloo")


def test_init_picks_the_backend_from_the_launchers_environment(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert detect() == "local"
    comm = em.distributed.init()
    assert (comm.rank, comm.world_size, comm.backend) == (0, 1, "local")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert detect() == "mpi"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert detect() == "gloo"
    with pytest.raises(ValueError, match="choose one of auto, gloo, mpi, local"):
        em.distributed.init("nccl")
    with pytest.raises(ValueError, match="timeout must be a positive"):
        em.distributed.init("local", timeout=0)


def test_gloo_without_a_launcher_says_to_use_torchrun(monkeypatch):
    pytest.importorskip("torch.distributed")
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(DistributedError, match="launch with torchrun"):
        em.distributed.init("gloo")


# -- sharded loading ---------------------------------------------------------------------

@pytest.mark.parametrize("drop_last", [True, False])
def test_shards_are_disjoint_equal_and_make_up_the_global_batches(drop_last):
    x = np.arange(103, dtype=np.float32)[:, None]
    y = np.arange(103)
    whole = em.DataLoader(x, y, 8, seed=3, drop_last=drop_last)
    ranks = [em.DataLoader(x, y, 4, seed=3, drop_last=drop_last, rank=r, world_size=2)
             for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    for _epoch in range(2):
        mine = [[yb for _, yb in loader] for loader in ranks]
        for batches in zip(*mine):
            assert len(batches[0]) == len(batches[1])
            if drop_last:
                assert not set(batches[0]) & set(batches[1])
        if drop_last:  # exactly the single-process global batches, in order
            for (_, yb), a, b in zip(whole, *mine):
                assert np.array_equal(yb, np.concatenate([a, b]))
        else:  # every row served, the pad taken from the head of the order
            served = np.concatenate([b for batches in mine for b in batches])
            assert set(served) == set(range(103)) and len(served) == 104


def test_a_shard_loader_checks_its_rank():
    x, y = np.zeros((10, 1), np.float32), np.zeros(10, np.int64)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\)"):
        em.DataLoader(x, y, 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size 8 x 2 ranks is larger than the data"):
        em.DataLoader(x, y, 8, rank=0, world_size=2)


# -- ember train under torchrun ----------------------------------------------------------

def ember_train(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("torch.distributed")
    return subprocess.run([sys.executable, "-m", "ember", "train", "--no-progress", *args],
                          env=ENV, capture_output=True, text=True, timeout=240)


def test_ember_train_nproc_prints_once_and_resumes_bit_exactly(tmp_path):
    """Resumed with the optimizer sharded (ZeRO-1) too: the same updates."""
    ck = str(tmp_path / "run.safetensors")
    two = ember_train("--nproc", "2", "--epochs", "2", "--save", ck)
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("final test accuracy") == 1  # rank 0 alone prints
    assert "batch 32 x 2 ranks" in two.stdout
    resumed = ember_train("--nproc", "2", "--epochs", "3", "--resume", ck, "--shard-optimizer")
    straight = ember_train("--nproc", "2", "--epochs", "3")
    assert resumed.returncode == 0 and straight.returncode == 0, resumed.stderr[-3000:]

    def epoch3(run):
        return next(line for line in run.stdout.splitlines()
                    if line.startswith("epoch   3")).split("steps/s")[0].rsplit(None, 1)[0]
    assert epoch3(resumed) == epoch3(straight)


def _descendants(pid: int) -> set[int]:
    """Every live process under `pid` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.add(c)
            todo.append(c)
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_ember_train_nproc_ends_every_rank(sig):
    """The signal reaches torchrun and the ranks (a process group of their own), not only
    the launcher: SIGKILLing torchrun, or dying alone, left both ranks training."""
    pytest.importorskip("torch.distributed")
    proc = subprocess.Popen([sys.executable, "-m", "ember", "train", "--no-progress",
                             "--nproc", "2", "--epochs", "100000"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert "epoch" in proc.stdout.readline() + proc.stdout.readline()  # ranks training
        ranks = _descendants(proc.pid)
        assert len(ranks) >= 3  # torchrun and two ranks
        proc.send_signal(sig)
        assert proc.wait(60) == 128 + sig
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{p}").exists() for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in ranks if Path(f"/proc/{p}").exists()
                and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1][:3]]
        assert not left, f"processes left running: {left}"
    finally:
        for p in _descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_the_data_parallel_example_runs_under_torchrun():
    pytest.importorskip("torch.distributed")
    example = HERE.parent.parent / "examples" / "data_parallel.py"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(example)], env=ENV, capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    epochs = [line for line in run.stdout.splitlines() if line.startswith("epoch")]
    assert len(epochs) == 5 and epochs[-1].endswith("(2 ranks)")  # printed by rank 0 alone
    assert float(epochs[-1].split("test acc")[1].split("%")[0]) > 90
