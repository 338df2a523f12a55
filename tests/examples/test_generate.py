"""examples/generate.py: KV-cache generation from a prefill compiled for a symbolic prompt
length (a graph per bucket) and one decode graph gives the tokens and logits of re-running
the whole model on the whole context (ember's interpreter, PyTorch's twin), and compiles a
handful of graphs."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ember as em

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("generate_example", ROOT / "examples" /
                                               "generate.py")
gen_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_example)
Gpt, Generator = gen_example.Gpt, gen_example.Generator


def small_gpt(block: int = 32) -> Gpt:
    em.seed(3)
    return Gpt(vocab=65, n_embd=32, n_head=4, n_layer=2, block=block)


@pytest.fixture(autouse=True)
def _unseeded():
    yield
    em.seed(None)


def cached_logits(gen: Generator, prompt: np.ndarray, tokens: np.ndarray) -> list[np.ndarray]:
    """The logits after the prompt and after each of `tokens` [B, n], fed one at a time."""
    logits, caches = gen.prefill(prompt)
    out = [logits]
    for i in range(tokens.shape[1]):
        logits, caches = gen.step(tokens[:, i], prompt.shape[1] + i, caches)
        out.append(logits)
    return out


def test_greedy_tokens_equal_rerunning_the_whole_model_on_the_whole_context():
    gpt = small_gpt()
    prompt = gen_example.encode("Hello, wor")[None]
    ids = Generator(gpt).generate(prompt, 20)
    assert ids.shape == (1, 30) and (ids[:, :10] == prompt).all()
    context = prompt
    for _ in range(20):  # no cache: the interpreter on the exact context, a graph per length
        logits = em.compile(gpt, context, backend="interpreter")(context)[:, -1]
        context = np.concatenate([context, logits.argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(ids, context)


def test_logits_match_the_pytorch_twin_at_every_step_for_a_batch_of_prompts():
    torch = pytest.importorskip("torch")
    from gpt import torch_twin  # benchmarks/ is on sys.path once the example is imported

    gpt = small_gpt()
    twin = torch_twin(gpt)
    rng = np.random.default_rng(0)
    prompt, tokens = rng.integers(0, 65, (2, 11)), rng.integers(0, 65, (2, 12))
    ours = cached_logits(Generator(gpt, batch=2), prompt, tokens)
    context = np.concatenate([prompt, tokens], axis=1)
    with torch.no_grad():
        theirs = twin(torch.from_numpy(context)).numpy()
    for i, logits in enumerate(ours):
        np.testing.assert_allclose(logits, theirs[:, 10 + i], rtol=0, atol=1e-4)


def test_a_hundred_new_tokens_compile_two_graphs_and_buckets_are_shared(capsys):
    gen = Generator(small_gpt(block=128))
    ids = gen.generate(gen_example.encode("abc")[None], 100)
    assert ids.shape == (1, 103)
    assert gen.compiles == 2
    gen.generate(gen_example.encode("abcdefg")[None], 10)  # 7 tokens: bucket 8 again
    assert gen.compiles == 2 and "recompiling" not in capsys.readouterr().err
    gen.generate(gen_example.encode("abcdefghi")[None], 10)  # 9: bucket 16
    assert gen.compiles == 3 and "inputs [1, 16] i64; was [1, 8] i64" in capsys.readouterr().err
    assert len(gen.decode._cache) == 1  # no hidden recompiles behind it


def test_buckets_are_powers_of_two_up_to_the_context():
    assert gen_example.buckets(48) == (8, 16, 32, 48)
    assert gen_example.buckets(64) == (8, 16, 32, 64) and gen_example.buckets(4) == (4,)


def test_temperature_sampling_is_seeded_and_low_temperature_is_greedy():
    gen = Generator(small_gpt())
    prompt = gen_example.encode("seed")[None]
    a, b = (gen.generate(prompt, 12, temperature=1.0, seed=5) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    assert not (a == gen.generate(prompt, 12, temperature=1.0, seed=6)).all()
    np.testing.assert_array_equal(gen.generate(prompt, 12, temperature=1e-6),
                                  gen.generate(prompt, 12))


def test_a_prompt_longer_than_the_context_is_a_clear_error():
    gen = Generator(small_gpt(block=16))
    with pytest.raises(ValueError, match="17 tokens; the model's context holds 1 to 16"):
        gen.prefill(np.zeros((1, 17), np.int64))
    with pytest.raises(ValueError, match="exceed the model's context of 16"):
        gen.generate(np.zeros((1, 10), np.int64), 7)
    with pytest.raises(ValueError, match="a batch of 2 prompts for a Generator of batch 1"):
        gen.prefill(np.zeros((2, 4), np.int64))
    with pytest.raises(ValueError, match=r"prompt buckets \(8, 32\) exceed the model's "
                                         "context of 16"):
        Generator(gen.gpt, sizes=(8, 32))
    assert gen.compiles == 0


def test_the_command_line_prints_text_rate_and_compiles():
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "generate.py"), "--tokens",
                          "20", "--prompt", "Hi", "--block", "32", "--train", "3"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    trained, rest = run.stdout.split("\n", 1)
    assert trained.startswith("trained 3 steps: loss ")
    text, summary = rest.rstrip("\n").rsplit("\n", 1)
    assert text.startswith("Hi") and len(text) == 22
    assert "tokens/s" in summary and "2 compiles" in summary
    assert "recompiling" not in run.stderr


def test_the_graphs_agree_with_the_interpreter_backend():
    gpt = small_gpt()
    prompt, tokens = gen_example.encode("abcde")[None], gen_example.encode("fghij")[None]
    cpu, ref = (cached_logits(Generator(gpt, backend=b), prompt, tokens)
                for b in ("cpu", "interpreter"))
    for a, b in zip(cpu, ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_a_custom_bucketing_pads_prompts_to_its_sizes(capsys):
    gen = Generator(small_gpt(), sizes=(32,))
    short, long = (gen.generate(gen_example.encode(s)[None], 5) for s in ("ab", "abcdefghijk"))
    assert gen.compiles == 2 and "recompiling" not in capsys.readouterr().err
    np.testing.assert_array_equal(short, Generator(small_gpt()).generate(short[:, :2], 5))
    np.testing.assert_array_equal(long, Generator(small_gpt()).generate(long[:, :11], 5))


def test_a_prompt_past_the_last_bucket_compiles_its_exact_length(capsys):
    gen = Generator(small_gpt(), sizes=(8,))
    ids = gen.generate(gen_example.encode("abcdefghijk")[None], 5)
    assert "T=11 is above the largest bucket 8" in capsys.readouterr().err
    np.testing.assert_array_equal(ids, Generator(small_gpt()).generate(ids[:, :11], 5))
