"""The `.mlir` tests run under lit too (lit.cfg.py), passing where they pass under pytest
and failing where a CHECK does not match; skipped where lit is not installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lit")

HERE = Path(__file__).parent


def lit(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from lit.main import main; main()", "-v",
                           *map(str, paths)], capture_output=True, text=True, timeout=300)


def test_lit_runs_the_filecheck_files():
    r = lit(HERE / "cse.mlir", HERE / "autodiff-errors.mlir")  # a pass, and `not ... 2>&1`
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS: ember :: cse.mlir" in r.stdout and "Passed: 2" in r.stdout


def test_lit_fails_a_check_that_does_not_match(tmp_path):
    for name in ("lit.cfg.py", "run_tools.py"):
        shutil.copy(HERE / name, tmp_path / name)
    text = (HERE / "cse.mlir").read_text()
    wrong = text.replace("// CHECK", "// CHECK: no such line\n// CHECK", 1)
    (tmp_path / "wrong.mlir").write_text(wrong)
    r = lit(tmp_path / "wrong.mlir")
    assert r.returncode == 1 and "FAIL: ember :: wrong.mlir" in r.stdout, r.stdout
