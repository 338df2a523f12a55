"""The README's "Coming from PyTorch" table is true: each row's PyTorch expression and its
ember spelling give the same values (ember's inside a traced forward on the cpu backend)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import ember as em

torch = pytest.importorskip("torch")

README = Path(__file__).resolve().parents[1] / "README.md"
X = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)


def table_rows() -> list[tuple[str, str]]:
    """(torch expression, ember expression) pairs, cell by cell: an ember cell that says
    "the same" reuses torch's expressions from where its own run out."""
    text = README.read_text()
    body = text[text.index("| PyTorch | ember |"):].split("\n\n", 1)[0].splitlines()[2:]
    pairs = []
    for row in body:
        theirs, ours = (c.strip() for c in row.strip().strip("|").split("|"))
        theirs = re.findall(r"`([^`]+)`", theirs)
        mine = re.findall(r"`([^`]+)`", ours)
        if "the same" in ours:
            mine += theirs[len(mine):]
        assert len(mine) == len(theirs), row
        pairs += zip(theirs, mine)
    return pairs


class Fn(em.nn.Module):
    def __init__(self, expr: str):
        super().__init__()
        self.expr = expr

    def forward(self, x):
        return eval(self.expr, {"em": em, "np": np, "F": em.nn.functional, "x": x})  # noqa: S307


@pytest.mark.parametrize("theirs, ours", table_rows())
def test_a_row_means_the_same_in_both(theirs, ours):
    want = eval(theirs, {"torch": torch, "F": torch.nn.functional,  # noqa: S307
                         "x": torch.tensor(X)}).numpy()
    got = em.compile(Fn(ours), X, backend="cpu")(X) if "x" in ours else eval(  # noqa: S307
        ours, {"em": em, "np": np})
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_table_has_every_row():
    assert len(table_rows()) >= 30
