"""ONNX's own backend node tests for every op `em.onnx.load` imports, on the interpreter and
the cpu backend, against the outputs ONNX ships with them.

The installed onnx wheel has no `onnx/backend/test/data/node/*/model.onnx` files, so the
cases are generated in memory by `onnx.backend.test.case.node.collect_testcases()` (the
code that writes those files): the same models and data. ember compiles for static shapes,
so a case input that feeds a static slot (a Reshape's shape, a Slice's starts, a Pad's pads)
is given to the import as a constant rather than at run time.

Every case that does not run is in EXPECTED_SKIPS with the reason, and must be skipped for
that reason (an OnnxImportError at import, or the cpu backend lacking a dtype): a case that
starts to pass, or newly stops, fails here until the list is updated. KNOWN_FAILURES are the
cases that import but fail otherwise (a different result, a later error): strict xfails.
`python tests/interop/test_onnx_conformance.py` prints the per-op table of the README.
"""

import functools
import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # ONNX's whole node-test suite


onnx = pytest.importorskip("onnx")

import ember as em  # noqa: E402
from ember.interop.onnx_import import load  # noqa: E402
from ember.interop.onnx_ops import RULES  # noqa: E402

OPS = ("Add Sub Mul Div Pow Neg Abs Erf Sqrt Exp Log Tanh Sigmoid Relu LeakyRelu Softplus Gelu "
       "Softmax LogSoftmax Gemm MatMul Conv ConvTranspose MaxPool AveragePool GlobalAveragePool "
       "BatchNormalization LayerNormalization Dropout ReduceSum ReduceMean ReduceMax ReduceMin "
       "Reshape Transpose Flatten Concat Gather Sum Max Min Clip Where Squeeze Unsqueeze Expand "
       "Slice Cast Split Identity Pad ArgMax Shape Constant Less LessOrEqual Greater "
       "GreaterOrEqual Equal Not And Or Xor IsNaN IsInf Mod Sign Reciprocal HardSigmoid "
       "HardSwish Trilu CumSum TopK Einsum Range ConstantOfShape GatherElements GatherND "
       "ScatterND ScatterElements SplitToSequence SequenceConstruct SequenceInsert SequenceErase "
       "SequenceAt SequenceLength ConcatFromSequence Resize").split()
BACKENDS = ("interpreter", "cpu")
TOLERANCE = {"interpreter": (1e-5, 1e-6), "cpu": (1e-4, 1e-5)}  # (rtol, atol) in the dtype
ROUNDED = {"test_averagepool_2d_ceil_last_window_starts_on_pad"}  # expected values to 4 digits

_INTS = "int8 int16 uint8 uint16 uint32 uint64"
_CAST_TYPES = ["test_cast_" + n for n in """
    FLOAT16_to_FLOAT4E2M1 FLOAT16_to_FLOAT8E4M3FN
    FLOAT16_to_FLOAT8E4M3FNUZ FLOAT16_to_FLOAT8E5M2 FLOAT16_to_FLOAT8E5M2FNUZ
    FLOAT16_to_INT2 FLOAT16_to_INT4 FLOAT16_to_UINT2 FLOAT16_to_UINT4
    FLOAT4E2M1_to_FLOAT FLOAT4E2M1_to_FLOAT16 FLOAT8E4M3FNUZ_to_FLOAT
    FLOAT8E4M3FNUZ_to_FLOAT16 FLOAT8E4M3FN_to_FLOAT FLOAT8E4M3FN_to_FLOAT16
    FLOAT8E5M2FNUZ_to_FLOAT FLOAT8E5M2FNUZ_to_FLOAT16 FLOAT8E5M2_to_FLOAT
    FLOAT8E5M2_to_FLOAT16 FLOAT_to_FLOAT4E2M1 FLOAT_to_FLOAT8E4M3FN
    FLOAT_to_FLOAT8E4M3FNUZ FLOAT_to_FLOAT8E5M2 FLOAT_to_FLOAT8E5M2FNUZ FLOAT_to_INT2
    FLOAT_to_INT4 FLOAT_to_UINT2 FLOAT_to_UINT4 INT2_to_FLOAT INT2_to_FLOAT16
    INT2_to_INT8 INT4_to_FLOAT INT4_to_FLOAT16 INT4_to_INT8 UINT2_to_FLOAT
    UINT2_to_FLOAT16 UINT2_to_UINT8 UINT4_to_FLOAT UINT4_to_FLOAT16 UINT4_to_UINT8
    e8m0_FLOAT16_to_FLOAT8E8M0 e8m0_FLOAT8E8M0_to_FLOAT e8m0_FLOAT8E8M0_to_FLOAT16
    e8m0_FLOAT_to_FLOAT8E8M0 no_saturate_FLOAT16_to_FLOAT8E4M3FN
    no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ no_saturate_FLOAT16_to_FLOAT8E5M2
    no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ no_saturate_FLOAT_to_FLOAT8E4M3FN
    no_saturate_FLOAT_to_FLOAT8E4M3FNUZ no_saturate_FLOAT_to_FLOAT8E5M2
    no_saturate_FLOAT_to_FLOAT8E5M2FNUZ
""".split()]
# reason -> the cases skipped for it (on every backend)
EXPECTED_SKIPS = {
    "ONNX types ember has not (int8/16, unsigned, float8, 4- and 2-bit)": [
        f"test_{op}_{t}" for op in ("add", "sub", "mul", "div", "max", "min", "equal", "greater",
                                    "greater_equal", "less", "less_equal")
        for t in _INTS.split()] + [
        "test_clip_default_int8_inbounds", "test_clip_default_int8_max",
        "test_clip_default_int8_min", "test_maxpool_2d_uint8", "test_pow_types_float32_uint32",
        "test_pow_types_float32_uint64", "test_mod_mixed_sign_int8", "test_mod_mixed_sign_int16",
        "test_mod_uint8", "test_mod_uint16", "test_mod_uint32", "test_mod_uint64",
        "test_top_k_uint64"] + _CAST_TYPES,
    "AveragePool with dilations": [
        "test_averagepool_2d_dilations", "test_averagepool_3d_dilations_small",
        *(f"test_averagepool_3d_dilations_large_count_include_pad_is_{i}_ceil_mode_is_{c}"
          for i in (0, 1) for c in ("True", "False"))],
    "MaxPool's Indices output": ["test_maxpool_with_argmax_2d_precomputed_pads",
                                 "test_maxpool_with_argmax_2d_precomputed_strides"],
    "training mode (BatchNormalization, Dropout)": [
        "test_batchnorm_epsilon_training_mode", "test_batchnorm_example_training_mode",
        "test_training_dropout", "test_training_dropout_default",
        "test_training_dropout_default_mask", "test_training_dropout_mask",
        "test_training_dropout_zero_ratio", "test_training_dropout_zero_ratio_mask"],
    "string tensors": ["test_equal_string", "test_equal_string_broadcast"],
    "sequence and optional values": ["test_identity_opt", "test_identity_sequence"],
    "max/min of bool tensors or over an empty axis": [
        "test_reduce_max_bool_inputs", "test_reduce_min_bool_inputs", "test_reduce_max_empty_set",
        "test_reduce_max_empty_set_bool", "test_reduce_min_empty_set"],
    "Einsum diagonals (a label repeated in one operand)": ["test_einsum_batch_diagonal"],
    "scatter reductions mul/max/min": [
        "test_scatter_elements_with_reduction_max", "test_scatter_elements_with_reduction_min",
        "test_scatter_elements_with_reduction_mul", "test_scatternd_max",
        "test_scatternd_max_with_element_indices", "test_scatternd_min",
        "test_scatternd_min_with_element_indices", "test_scatternd_multiply"],
    "sequences as graph inputs or outputs": [
        "test_sequence_insert_at_back", "test_sequence_insert_at_front",
        "test_split_to_sequence_1", "test_split_to_sequence_2",
        "test_split_to_sequence_nokeepdims"],
    "Mod of floats with fmod=0 (opset 28's)": [
        f"test_mod_{c}" for c in ("float16_mixed_sign_fmod_0", "float32_mixed_sign_fmod_0",
                                  "float64_mixed_sign_fmod_0", "float_edge_cases_fmod_0_float16",
                                  "float_edge_cases_fmod_0_float32",
                                  "float_edge_cases_fmod_0_float64")],
    "Resize's cubic mode, antialias, exclude_outside, tf_crop_and_resize, not_larger/not_smaller": [
        f"test_resize_{c}" for c in """
        downsample_scales_cubic downsample_scales_cubic_A_n0p5_exclude_outside
        downsample_scales_cubic_align_corners downsample_scales_cubic_antialias
        downsample_scales_linear_antialias downsample_sizes_cubic downsample_sizes_cubic_antialias
        downsample_sizes_linear_antialias downsample_sizes_nearest_not_larger
        downsample_sizes_nearest_not_smaller tf_crop_and_resize tf_crop_and_resize_axes_2_3
        tf_crop_and_resize_axes_3_2 tf_crop_and_resize_extrapolation_value
        upsample_scales_cubic upsample_scales_cubic_A_n0p5_exclude_outside
        upsample_scales_cubic_align_corners upsample_scales_cubic_asymmetric upsample_sizes_cubic
        upsample_sizes_nearest_not_larger upsample_sizes_nearest_not_smaller""".split()],
}
# reason -> the cases the cpu backend alone cannot run (none: f16 and bf16 run in f32 there)
CPU_SKIPS: dict[str, list[str]] = {}
# reason -> (the exception, the cases): known to fail (xfail, strict), on every backend
KNOWN_FAILURES = {
    "align_corners at a fractional scale: ember takes length_resized as the output size, as "
    "onnxruntime does (ONNX's reference: length * scale, unrounded)": (
        AssertionError, ["test_resize_downsample_scales_linear_align_corners"]),
}


@functools.cache
def cases() -> dict:
    """The node tests of OPS (one node each, not the function-expanded variants), and ONNX's
    small sequence models (`test_sequence_model*`, two or more nodes: SequenceAt,
    ConcatFromSequence and SequenceErase have no node tests of their own)."""
    from onnx.backend.test.case import model, node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = [c for c in node.collect_testcases() if len(c.model.graph.node) == 1
                 and not c.name.endswith("_expanded")]
        found += [c for c in model.collect_testcases() if c.name.startswith("test_sequence_model")]
    return {c.name: c for c in found if ops_of(c)}


def ops_of(case) -> set[str]:
    """The ops of OPS a case tests: its nodes' (a sequence model counts for each of them)."""
    return {n.op_type for n in case.model.graph.node} & set(OPS)


def _array(v) -> np.ndarray | list:
    """A case's value as numpy (a sequence as a list of arrays)."""
    if isinstance(v, list):
        return [_array(a) for a in v]
    return onnx.numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)


def _skip_reason(name: str, backend: str) -> str | None:
    tables = [EXPECTED_SKIPS] + ([CPU_SKIPS] if backend == "cpu" else [])
    return next((r for t in tables for r, names in t.items() if name in names), None)


def _known_failure(name: str) -> tuple[str, type] | None:
    return next(((r, e) for r, (e, names) in KNOWN_FAILURES.items() if name in names), None)


def _params() -> list:
    """(name, backend) of every test_node, a known failure marked xfail (strict, by its
    exception: fixed, or failing otherwise, it fails here)."""
    out = []
    for name in sorted(cases()):
        known = _known_failure(name)
        marks = [pytest.mark.xfail(reason=known[0], raises=known[1], strict=True)] if known else []
        out += [pytest.param(name, b, marks=marks) for b in BACKENDS]
    return out


def run(name: str, backend: str) -> list[np.ndarray]:
    """Import and compile the case, run it on its first data set; the outputs."""
    from ember.backends.errors import UnsupportedOpError

    case = cases()[name]
    inputs, _ = case.data_sets[0]
    names = [i.name for i in case.model.graph.input]
    values = dict(zip(names, map(_array, inputs)))
    bound = {n: values[n] for node in case.model.graph.node for k, n in enumerate(node.input)
             if node.op_type in RULES and k in RULES[node.op_type].static and n in values}
    feeds = [v for n, v in values.items() if n not in bound]
    try:
        forward = em.compile(load(case.model, constants=bound), *feeds, backend=backend)
    except UnsupportedOpError as e:
        raise em.onnx.OnnxImportError(f"the {backend} backend: {e}") from e
    out = forward(*feeds)
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("name, backend", _params())
def test_node(name, backend):
    reason = _skip_reason(name, backend)
    try:
        got = run(name, backend)
    except em.onnx.OnnxImportError as e:
        if reason is None:
            raise
        pytest.skip(f"{reason}: {e}")
    assert reason is None, f"{name} now runs on {backend}: strike it from the skips ({reason})"
    rtol, atol = TOLERANCE[backend]
    if name in ROUNDED:
        rtol = cases()[name].rtol
    want = [_array(v) for v in cases()[name].data_sets[0][1]]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)


def test_every_expected_skip_is_a_case():
    listed = {n for t in (EXPECTED_SKIPS, CPU_SKIPS) for names in t.values() for n in names}
    listed |= {n for _, names in KNOWN_FAILURES.values() for n in names}
    assert not listed - set(cases()), sorted(listed - set(cases()))


def test_every_op_has_a_passing_case():
    skipped = {n for names in EXPECTED_SKIPS.values() for n in names}
    skipped |= {n for _, names in KNOWN_FAILURES.values() for n in names}
    covered = set().union(*(ops_of(cases()[n]) for n in cases() if n not in skipped))
    assert covered == set(OPS), sorted(set(OPS) - covered)


def table() -> str:
    """The README's table: cases per op that run (on both backends) and that are skipped
    (or known to fail); a sequence model counts for each op of OPS it has."""
    rows = ["| op | pass | skip (why) |", "|---|---|---|"]
    for op in OPS:
        names = [n for n, c in cases().items() if op in ops_of(c)]
        why = sorted({r for n in names for b in BACKENDS if (r := _skip_reason(n, b))}
                     | {k[0] for n in names if (k := _known_failure(n))})
        skip = sum(_skip_reason(n, "interpreter") is not None or _known_failure(n) is not None
                   for n in names)
        cpu = sum(n in sum(CPU_SKIPS.values(), []) for n in names)
        rows.append(f"| {op} | {len(names) - skip} | {skip or ''}"
                    + (f" (+{cpu} on cpu)" if cpu else "") + (f" ({'; '.join(why)})" if why
                                                              else "") + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
