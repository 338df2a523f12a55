"""What packaging promises: `em.__version__` and `ember --version` agree with the
distribution, and `py.typed` ships as package data so type checkers read ember's hints."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

import ember as em
from ember.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_is_the_distributions_and_the_clis(capsys):
    assert em.__version__ == importlib.metadata.version("ember") == \
        PYPROJECT["project"]["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", em.__version__)
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"ember {em.__version__}"


def test_without_metadata_the_version_comes_from_pyproject(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert em._version() == PYPROJECT["project"]["version"]


def test_py_typed_is_package_data():
    assert (ROOT / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["ember"]
