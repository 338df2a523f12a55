"""The cuda backend writes a single-output elementwise `kernel.fused` over an operand that
dies there, as the cpu's arena does (ir/memory_plan.py's `in_place_operands`), and never
over one it reads through another map too, nor one another op still reads. Checked on the
plan without a GPU, and by value in the CUDA emulator (g++) where it is available."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends import interpreter
from ember.backends.cuda import emulate
from ember.backends.cuda.codegen import lower
from ember.backends.cuda.program import Launch
from ember.ir import verify
from ember.ir.parser import parse

needs_emulator = pytest.mark.skipif(not emulate.available(), reason="the CUDA emulator needs g++")


def fused(maps: str, keep: bool = False):
    """tanh(x), then one kernel.fused of it with itself through `maps`; `keep`: the tanh is
    returned too (it lives on)."""
    ret = "%r, %t" if keep else "%r"
    types = "tensor<8x8xf32>, tensor<8x8xf32>" if keep else "tensor<8x8xf32>"
    return verify(parse(f"""
    func.func @f(%x: tensor<8x8xf32>) -> ({types}) {{
      %t = "ember.tanh"(%x) : (tensor<8x8xf32>) -> tensor<8x8xf32>
      %p = "kernel.fused"(%t, %t) ({{
      ^bb0(%a: f32, %b: f32):
        %m = "kernel.mul"(%a, %b) : (f32, f32) -> f32
        "kernel.yield"(%m) : (f32) -> ()
      }}) {{maps = {maps}, out_maps = [[8, 1]], out_types = [tensor<8x8xf32>],
          space = [8, 8]}} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
      %r = "ember.neg"(%p) : (tensor<8x8xf32>) -> tensor<8x8xf32>
      func.return {ret} : {types}
    }}"""))


CASES = {"square": ("[[8, 1], [8, 1]]", False, True),  # t * t: read where written
         "transposed": ("[[8, 1], [1, 8]]", False, False),  # t * t^T: clobbers t^T
         "alive": ("[[8, 1], [8, 1]]", True, False)}  # t is returned: it lives on


@pytest.mark.parametrize("case", list(CASES))
def test_a_fused_kernel_writes_over_a_dying_operand_only(case):
    maps, keep, in_place = CASES[case]
    p = lower(fused(maps, keep))
    launch = next(s for s in p.steps if isinstance(s, Launch) and "fused" in s.kernel)
    assert (launch.args[0] == launch.args[1]) == in_place
    restrict = "__restrict__" in p.source.split(launch.kernel + "(", 1)[1].split(")", 1)[0]
    assert restrict != in_place  # an aliased result is no restrict pointer


@needs_emulator
@pytest.mark.parametrize("case", list(CASES))
def test_in_place_fused_kernels_compute_the_interpreters_values(case):
    maps, keep, _ = CASES[case]
    g = fused(maps, keep)
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    for got, want in zip(emulate.EmulatedExecutable(g)([x]), interpreter.run(g, [x])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
