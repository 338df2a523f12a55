"""One check shared by the test_torch_semantics_* files: an ember function against the torch
function of the same arguments, values and gradients, on a backend.

Float inputs become Params (so ember gives their gradients), integer and boolean inputs
constants; the gradient is that of sum(first output * a fixed random cotangent).
"""

from __future__ import annotations

import numpy as np

import ember as em
from ember import nn

TOL = 1e-5


class _Fn(nn.Module):
    """`fn` of the inputs, the float ones held as Params; the traced input is a dummy."""

    def __init__(self, fn, inputs):
        super().__init__()
        self.params = [em.Param.from_array(a) for a in inputs if _is_float(a)]
        self.fn, self.inputs = fn, inputs

    def forward(self, _):
        params = iter(self.params)
        return self.fn(*(next(params) if _is_float(a) else a for a in self.inputs))


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f"


def _outputs(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def torch_result(theirs, inputs, cotangent=None):
    """torch's outputs and, given a cotangent, the gradients of its float inputs."""
    import torch

    ts = [torch.tensor(a, requires_grad=_is_float(a)) for a in inputs]
    outs = _outputs(theirs(*ts))
    grads = []
    if cotangent is not None:
        (outs[0] * torch.tensor(cotangent)).sum().backward()
        grads = [t.grad.numpy() for t in ts if t.requires_grad]
    return [o.detach().numpy() for o in outs], grads


def check(ours, theirs, *inputs, backend: str, grad: bool = True, tol: float = TOL) -> float:
    """Assert ember's values (and, with float inputs, gradients) match torch's within `tol`;
    the max error."""
    inputs = [np.asarray(a) for a in inputs]
    grad = grad and any(_is_float(a) for a in inputs)
    model = _Fn(ours, inputs)
    dummy = np.zeros(1, np.float32)
    got = _outputs(em.compile(model, dummy, backend=backend)(dummy))
    cot = np.random.default_rng(1).standard_normal(got[0].shape).astype(got[0].dtype)
    want, want_grads = torch_result(theirs, inputs, cot if grad else None)
    errors = [0.0]
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        errors.append(_compare(g, w, tol))
    if grad:
        grads = em.compile_grad(model, lambda out, _: (_outputs(out)[0] * cot).sum(),
                                backend=backend)(dummy, dummy)
        for p, w in zip(model.params, want_grads, strict=True):
            errors.append(_compare(grads[p.id], w, tol))
    return max(errors)


def _compare(got: np.ndarray, want: np.ndarray, tol: float) -> float:
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    finite = np.isfinite(want)
    return float(np.abs(got[finite].astype(np.float64) - want[finite]).max(initial=0.0))
