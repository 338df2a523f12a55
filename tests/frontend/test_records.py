"""Records: safetensors save/load (bit-exact, ids restored, atomic, errors change nothing)
and PyTorch imports."""

import json
import os
import re

import numpy as np
import pytest
from file_damage import join, split
from safetensors import safe_open
from small_models import ToDtype

import ember as em
from ember import nn
from ember.frontend.records import RecordError, load, load_torch, save
from ember.ir import numpy_dtype


class Net(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.layers = [nn.Linear(4, width), nn.Linear(width, 3)]
        self.norm = nn.BatchNorm1d(3)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(self.norm(self.layers[1](self.layers[0](x))))


def values(model):
    return {path: p.val().copy() for path, p in model.all_params() if p.kind != "flag"}


def test_save_load_round_trips_bit_exactly_with_ids(tmp_path):
    a = Net()
    a.norm.running_var.set_value(np.array([0.5, np.pi, 1e-30], np.float32))
    path = tmp_path / "net.safetensors"
    save(a, path)
    assert not [f for f in os.listdir(tmp_path) if f != "net.safetensors"]  # no temp left
    with safe_open(str(path), framework="np") as f:
        assert sorted(f.keys()) == sorted(values(a))
        ids = json.loads(f.metadata()["ember.param_ids"])
    assert ids["layers.0.weight"] == str(a.layers[0].weight.id)
    b = Net()
    assert load(b, path) is b
    va, vb = values(a), values(b)
    assert all(va[k].tobytes() == vb[k].tobytes() and va[k].dtype == vb[k].dtype for k in va)
    assert [p.id for _, p in a.all_params() if p.kind != "flag"] == [
        p.id for _, p in b.all_params() if p.kind != "flag"]


def test_a_0d_param_round_trips_as_0d(tmp_path):
    """A learnable temperature: numpy's ascontiguousarray would have written it 1-d, and
    loading it back would then refuse the file."""
    a, b = Net(), Net()
    a.temperature = em.Param.from_array(np.array(0.75, np.float32))
    b.temperature = em.Param.from_array(np.array(1.0, np.float32))
    save(a, tmp_path / "net.safetensors")
    with safe_open(str(tmp_path / "net.safetensors"), framework="np") as f:
        assert f.get_tensor("temperature").shape == ()
    load(b, tmp_path / "net.safetensors")
    assert b.temperature.val().shape == () and b.temperature.val() == 0.75


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_bf16_and_f16_records_round_trip_and_load_in_torch(tmp_path, dtype):
    """Saved as safetensors BF16 / F16: the same bits back in ember and in PyTorch."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    a = Net().map(ToDtype(dtype))
    path = tmp_path / "net.safetensors"
    save(a, path)
    theirs = load_file(str(path))
    for k, v in values(a).items():
        want = torch.bfloat16 if dtype == "bf16" else torch.float16
        assert v.dtype == numpy_dtype(dtype) and theirs[k].dtype == want
        assert theirs[k].view(torch.int16).numpy().tobytes() == v.tobytes()
    b = Net().map(ToDtype(dtype))
    load(b, path)
    assert all(v.tobytes() == values(b)[k].tobytes() for k, v in values(a).items())
    with pytest.raises(RecordError, match=f"the file has \\[4, 8\\] {numpy_dtype(dtype)}, the "
                                          "model has \\[4, 8\\] float32"):
        load(Net(), path)


def test_load_torch_keeps_bf16_where_the_param_is_bf16():
    torch = pytest.importorskip("torch")
    model = nn.Linear(3, 2).map(ToDtype("bf16"))
    model.bias = em.Param.from_array(np.zeros(2, np.float32))
    weight = torch.randn(2, 3).to(torch.bfloat16)  # PyTorch's [out, in]
    load_torch(model, {"weight": weight, "bias": torch.full((2,), 0.1, dtype=torch.bfloat16)})
    assert model.weight.val().dtype == numpy_dtype("bf16")
    assert model.weight.val().tobytes() == weight.T.contiguous().view(torch.int16).numpy().tobytes()
    assert model.bias.val().dtype == np.float32  # an f32 param: bf16 0.1, exactly widened
    assert (model.bias.val() == np.float32(torch.tensor(0.1, dtype=torch.bfloat16).item())).all()


def test_save_replaces_the_old_file_atomically(tmp_path, monkeypatch):
    path = tmp_path / "net.safetensors"
    save(Net(), path)
    before = path.read_bytes()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        save(Net(), path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["net.safetensors"]


def test_truncated_file_is_a_clear_error_and_changes_nothing(tmp_path):
    path = tmp_path / "net.safetensors"
    save(Net(), path)
    data = path.read_bytes()
    model = Net()
    before = values(model)
    for cut in (len(data) - 7, 20, 3):
        path.write_bytes(data[:cut])
        with pytest.raises(RecordError, match=r"cannot read the record .*net.safetensors.*"
                                              r"nothing was changed"):
            load(model, path)
    after = values(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_wrong_shapes_and_keys_are_all_listed_and_change_nothing(tmp_path):
    path = tmp_path / "wide.safetensors"
    save(Net(width=5), path)
    model = Net()
    before = values(model)
    with pytest.raises(RecordError) as e:
        load(model, path)
    msg = str(e.value)
    assert "mismatch at layers.0.weight: the file has [4, 5] float32, the model has [4, 8]" in msg
    assert "mismatch at layers.0.bias" in msg and "mismatch at layers.1.weight" in msg
    after = values(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)

    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [nn.Linear(4, 8)]
            self.extra = nn.Linear(2, 2)

    with pytest.raises(RecordError) as e:
        load(Other(), tmp_path / "wide.safetensors")
    msg = str(e.value)
    assert "missing: extra.weight, extra.bias" in msg
    assert ("unexpected: layers.1.bias, layers.1.weight, norm.beta, norm.gamma, "  # file order
            "norm.running_mean, norm.running_var") in msg
    save(Net(), path)
    other = Other()
    load(other, path, strict=False)  # only the matching keys
    assert np.array_equal(other.layers[0].weight.val(), load(Net(), path).layers[0].weight.val())


def test_load_torch_transposes_linear_and_renames_norms(tmp_path):
    torch = pytest.importorskip("torch")
    tn = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3),
                             torch.nn.BatchNorm1d(3))
    tn.train()
    tn(torch.randn(5, 4))  # running stats and num_batches_tracked change
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.BatchNorm1d(3))
    report = load_torch(model, tn.state_dict())
    assert "3.num_batches_tracked" in report.ignored and "num_batches_tracked" in str(report)
    np.testing.assert_array_equal(model.layers[0].weight.val(), tn[0].weight.detach().numpy().T)
    np.testing.assert_array_equal(model.layers[3].gamma.val(), tn[3].weight.detach().numpy())
    np.testing.assert_array_equal(model.layers[3].running_var.val(), tn[3].running_var.numpy())
    path = tmp_path / "t.pt"
    torch.save(tn.state_dict(), path)
    again = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.BatchNorm1d(3))
    load_torch(again, path)
    assert np.array_equal(again.layers[2].bias.val(), model.layers[2].bias.val())

    net = Net()
    key_map = {"0.": "layers.0.", "2.": "layers.1.", "3.": "norm."}
    load_torch(net, tn.state_dict(), key_map=key_map)
    np.testing.assert_array_equal(net.layers[1].weight.val(), tn[2].weight.detach().numpy().T)
    before = values(net)
    bad = dict(tn.state_dict())
    bad["2.weight"] = torch.zeros(3, 9)
    bad["zzz"] = torch.zeros(1)
    with pytest.raises(RecordError) as e:
        load_torch(net, bad, key_map=key_map)
    assert "mismatch at layers.1.weight: PyTorch has [9, 3]" in str(e.value)
    assert "unexpected: zzz" in str(e.value)
    assert all(np.array_equal(before[k], v) for k, v in values(net).items())


def test_load_torch_reads_files_only_with_weights_only(tmp_path):
    torch = pytest.importorskip("torch")

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, path)
    with pytest.raises(RecordError, match="weights_only=True.*unsupported GLOBAL posix.system"):
        load_torch(nn.Linear(2, 2), path)


def _with_ids(path, text):
    """The record at `path` with its ember.param_ids metadata replaced by `text`."""
    header, body = split(path.read_bytes())
    header["__metadata__"]["ember.param_ids"] = text
    path.write_bytes(join(header, body))


@pytest.mark.parametrize("ids,why", [
    ('["layers.0.weight"]', "a JSON array, not a JSON object"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # (3.13 parses 5000 levels)
    ('{"layers.0.weight": 7}', "the id of layers.0.weight is a JSON number"),
    ('{"layers.0.weight": {"a": [1]}}', "the id of layers.0.weight is a JSON object"),
    ('{"layers.0.weight": "not-a-param-id"}', "is not-a-param-id, not a ParamId"),
    ('{"layers.0.weight": "' + "v" * 14 + '"}', "not a ParamId"),
    ('{"layers.0.weight": ' + "9" * 5000 + "}", "digits"),
    ('{"layers.0.weight": 1e999}', "a JSON number"),
    ('{"layers.0.bias": "0000000000000", "layers.0.bias": "0000000000001"}',
     "duplicate key layers.0.bias"),
    ('{"\\u2603\\n": "0000000000000"}', "names '\u2603\\n', which has no tensor"),
    ("{not json", "Expecting property name"),
])
def test_damaged_param_ids_are_a_record_error_and_change_nothing(tmp_path, ids, why):
    path = tmp_path / "net.safetensors"
    save(Net(), path)
    _with_ids(path, ids)
    model = Net()
    before, before_ids = values(model), [p.id for _, p in model.all_params()]
    with pytest.raises(RecordError, match="damaged ember.param_ids metadata") as e:
        load(model, path)
    assert why in str(e.value) and "\n" not in str(e.value)
    assert all(np.array_equal(before[k], v) for k, v in values(model).items())
    assert [p.id for _, p in model.all_params()] == before_ids


def test_other_dtypes_and_non_records_are_record_errors_and_nan_is_data(tmp_path):
    path = tmp_path / "net.safetensors"
    save(Net(), path)
    good = path.read_bytes()
    model = Net()
    before = values(model)

    def fails(data, match):
        path.write_bytes(data)
        with pytest.raises(RecordError, match=match):
            load(model, path)
        assert all(np.array_equal(before[k], v) for k, v in values(model).items())

    header, body = split(good)
    for dtype, shape, shown in [("I32", [4, 8], "int32"), ("BF16", [4, 16], "bfloat16"),
                                ("F8_E4M3", [128], "F8_E4M3"), ("F32", [8, 4], "float32")]:
        edited = json.loads(json.dumps(header))
        edited["layers.0.weight"].update(dtype=dtype, shape=shape)
        fails(join(edited, body), re.escape(f"mismatch at layers.0.weight: the file has {shape} "
                                            f"{shown}, the model has [4, 8] float32"))
    fails(b"\x00" * 64, "cannot read the record")
    fails((2 ** 40).to_bytes(8, "little") + good[8:], "header too large")  # mmap: no allocation
    fails(good + b"garbage", "not fully covered")
    duplicated = join(json.dumps(header).replace('"layers.0.bias"', '"layers.0.weight"'), body)
    fails(duplicated, "cannot read the record")
    fails(b"", "cannot read the record")

    nan = Net()
    nan.layers[0].bias.set_value(np.full(8, np.nan, np.float32))
    save(nan, path)
    assert np.isnan(load(model, path).layers[0].bias.val()).all()


def test_damaged_torch_files_and_odd_state_dicts_are_record_errors(tmp_path):
    torch = pytest.importorskip("torch")
    model = nn.Linear(2, 2)
    before = values(model)
    path = tmp_path / "t.pt"
    torch.save({"weight": torch.zeros(2, 2), "bias": torch.zeros(2)}, path)
    data = path.read_bytes()
    for damaged in (data[:len(data) // 2], b"garbage" * 10, b""):
        path.write_bytes(damaged)
        with pytest.raises(RecordError, match="cannot read the PyTorch file") as e:
            load_torch(model, path)
        assert "\n" not in str(e.value)
    for state, match in [({"weight": {"a": 1}, "bias": torch.zeros(2)}, "at weight: a dict"),
                         ({"weight": "abc", "bias": torch.zeros(2)}, "not an array of real"),
                         ({"weight": [[1, 2], [3]], "bias": torch.zeros(2)}, "at weight"),
                         ({3: torch.zeros(2)}, "a key that is not a string: 3"),
                         ({"weight": torch.zeros(2, 2, dtype=torch.complex64),
                           "bias": torch.zeros(2)}, "complex64")]:
        with pytest.raises(RecordError, match=match):
            load_torch(model, state)
    assert all(np.array_equal(before[k], v) for k, v in values(model).items())
    load_torch(model, {"weight": torch.ones(2, 2, dtype=torch.bfloat16),
                       "bias": torch.ones(2, dtype=torch.float8_e4m3fn)})
    assert (model.weight.val() == 1).all() and (model.bias.val() == 1).all()
