"""The stage cache: a second compile of the same traced graph skips the IR passes, gives the
same final graph, stages and training, and a damaged entry is compiled again."""

import json

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.backends import cpu
from ember.backends.cpu.call import executable
from ember.cache_store import HEADER, vouched
from ember.runtime import stage_cache


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 20), nn.Linear(20, 5)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((16, 12)).astype(np.float32), rng.integers(0, 5, 16)


@pytest.fixture
def entries(tmp_path, monkeypatch):
    """The stage cache's folder, in tmp_path."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EMBER_CACHE", "1")
    return tmp_path / "stages"


def train(backend="interpreter", opt=None, steps=1, seed=0, **options):
    """(the step, its losses, the model's params after them)."""
    em.seed(seed)
    model = Mlp()
    step = em.compile_train_step(model, nn.functional.cross_entropy,
                                 opt or optim.AdamW(lr=1e-2), backend=backend, **options)
    losses = [step(*batch(s)) for s in range(steps)]
    return step, losses, {k: v.copy() for k, v in model.state_dict().items()}


def test_a_hit_gives_the_same_final_graph_and_training(entries):
    first, losses, params = train("cpu", steps=3)
    assert not first._last.stages.cached and len(list(entries.iterdir())) == 1
    again, losses_again, params_again = train("cpu", steps=3)
    assert again._last.stages.cached and again._last.run.cached  # the object cache hits too
    assert again.ir() == first.ir()
    assert losses_again == losses
    for k, v in params.items():
        np.testing.assert_array_equal(params_again[k], v, err_msg=k)


def test_other_param_ids_hit_and_get_their_own_ids_back(entries, monkeypatch):
    train()
    hit = train(seed=7)[0]  # other ids and initial values, the same traced graph otherwise
    monkeypatch.setenv("EMBER_CACHE", "0")
    fresh = train(seed=7)[0]
    assert hit._last.stages.cached and not fresh._last.stages.cached
    assert hit.ir() == fresh.ir()


def test_every_stage_after_a_hit_reads_as_without_the_cache(entries, tmp_path, monkeypatch):
    train()
    hit = train()[0]
    monkeypatch.setenv("EMBER_CACHE", "0")
    fresh = train()[0]
    assert hit._last.stages.cached and hit.stages == fresh.stages
    assert hit.ir("traced") == fresh.ir("traced") and hit.ir("fuse") == fresh.ir("fuse")
    assert hit._last.stages._pending is not None  # the traced and final texts ran no pass
    for stage in fresh.stages:
        assert hit.ir(stage) == fresh.ir(stage), stage
    assert hit._last.stages.unfused_text == fresh._last.stages.unfused_text  # with locations
    dumped = [open(p).read() for p in hit.dump_ir(str(tmp_path / "dump"))]
    assert dumped == [fresh.ir(stage, debuginfo=True) for stage in fresh.stages]
    with pytest.raises(KeyError, match="stages are traced, autodiff, decompose"):
        hit.ir("nonesuch")


DAMAGES = {
    "empty": lambda e: b"",
    "truncated": lambda e: e[:len(e) // 2],
    "a flipped byte": lambda e: e[:-10] + bytes([e[-10] ^ 0x40]) + e[-9:],
    "garbage": lambda e: np.random.default_rng(0).bytes(len(e)),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_entry_is_compiled_again_and_rewritten(entries, damage):
    want = train()[0].ir()
    (entry,) = entries.iterdir()
    intact = entry.read_bytes()
    entry.write_bytes(DAMAGES[damage](intact))
    step = train()[0]
    assert not step._last.stages.cached and step.ir() == want
    assert entry.read_bytes() == intact


def test_an_intact_entry_that_does_not_parse_is_compiled_again(entries):
    want = train()[0].ir()
    (entry,) = entries.iterdir()
    stage_cache._STORE.store(entry.stem, b"module { not a graph")
    step = train()[0]
    assert not step._last.stages.cached and step.ir() == want
    assert train()[0]._last.stages.cached


@pytest.mark.parametrize("other", [
    {"recompute": "all"},
    {"opt": optim.AdamW(lr=1e-2, weight_decay=0.5)},
    {"opt": optim.SGD(lr=1e-2, momentum=0.9)},
    {"backend": "cpu"},
])
def test_the_key_has_the_pipeline_and_the_backend(entries, other):
    train()
    step = train(**other)[0]
    assert not step._last.stages.cached and len(list(entries.iterdir())) == 2


def test_ember_cache_0_reads_and_writes_nothing(entries, monkeypatch):
    train()
    monkeypatch.setenv("EMBER_CACHE", "0")
    assert not train()[0]._last.stages.cached
    (entry,) = entries.iterdir()
    entry.unlink()
    train()
    assert not entries.exists() or not list(entries.iterdir())


def _packed(entry) -> dict:
    return json.loads(entry.read_bytes()[HEADER.size:])


UNREADABLE = {  # intact entries (sealed as ember seals them) that are no graph ember made
    "no tables": lambda p: {"format": p["format"], "graph": p["graph"]},
    "a type that does not parse": lambda p: {**p, "types": ["tensor<16x"] * len(p["types"])},
    "a param id's number past the ids": lambda p: {
        **p, "attrs": [a.replace("\0", "\09999", 1) for a in p["attrs"]]},
    "an operand defined later": lambda p: {
        **p, "graph": [p["graph"][0], p["graph"][1],
                       [p["graph"][2][0], [[o[0], [10 ** 6] * len(o[1]), *o[2:]]
                                           for o in p["graph"][2][1]]]]},
}


@pytest.mark.parametrize("how", UNREADABLE)
def test_an_intact_entry_that_does_not_unpack_is_compiled_again(entries, how):
    want = train()[0].ir()
    (entry,) = entries.iterdir()
    intact = entry.read_bytes()
    stage_cache._STORE.store(entry.stem, json.dumps(UNREADABLE[how](_packed(entry))).encode())
    step = train()[0]
    assert not step._last.stages.cached and step.ir() == want
    assert entry.read_bytes() == intact


def test_a_hit_neither_verifies_nor_prints_the_final_graph(entries, monkeypatch):
    """The stage cache vouches for it (cache_store.vouching): the passes verified it when
    they made it, and the entry's digest keys the object code instead of its text."""
    first = train("cpu")[0]

    def never(*args, **kwargs):
        raise AssertionError("verified or printed again")

    monkeypatch.setattr(executable, "verify", never)
    monkeypatch.setattr(executable, "print_graph", never)
    again = train("cpu")[0]
    assert again._last.stages.cached and again._last.run.cached
    assert again._last.run.cache_key == first._last.run.cache_key
    assert again.ir() == first.ir()
    assert vouched(again.graph) is None  # only while the backend compiles it
    with pytest.raises(AssertionError, match="verified or printed again"):
        cpu.compile(again.graph)  # a graph nobody vouches for is checked as ever


def test_a_miss_vouches_for_the_graph_it_stores(entries, monkeypatch):
    monkeypatch.setattr(executable, "print_graph", lambda *a, **k: 1 / 0)
    step = train("cpu")[0]
    assert not step._last.stages.cached and step._last.stages.digest is not None
    monkeypatch.setenv("EMBER_CACHE", "0")  # no digest: the graph is verified as ever
    assert train("cpu")[0]._last.stages.digest is None


def test_the_key_has_embers_version(entries, monkeypatch):
    train()
    with monkeypatch.context() as m:
        m.setattr(em, "__version__", "0.0.0-other")
        stage_cache._source_hash.cache_clear()
        try:
            assert not train()[0]._last.stages.cached and len(list(entries.iterdir())) == 2
        finally:
            stage_cache._source_hash.cache_clear()
    assert train()[0]._last.stages.cached


def test_numbering_reaches_quoted_ids_and_roles_only():
    """An id left anywhere else (bare, or inside a longer string) would be restored wrong:
    such a text is not stored; nor is one with a NUL, which would read back as a number."""
    ids = stage_cache.param_ids(em.trace(Mlp(), em.TensorSpec((2, 12), "f32")))
    assert len(ids) == 4
    text = f'"{ids[0]}" "{ids[1]}:exp_avg" "\\22{ids[2]}" "x" {{k = "{ids[3]}"}}'
    numbered = stage_cache.number_ids(text.replace(f"\\22{ids[2]}", ""), ids)
    assert numbered == '"\x000\x00" "\x001\x00:exp_avg" "" "x" {k = "\x003\x00"}'
    assert stage_cache.restore_ids(numbered, ids) == text.replace(f"\\22{ids[2]}", "")
    for left in (text, f'"{ids[0]}" {ids[0]}', f'"x{ids[0]}"', f'"{ids[0]}\\22"'):
        assert stage_cache.number_ids(left, ids) is None, left
    assert stage_cache.number_ids("a\0b", ids) is None
