"""lit's configuration for the `.mlir` tests here: `lit tests/filecheck` runs the same RUN
lines that conftest.py runs under pytest, with the same meaning of `ember opt` and
`filecheck` (run_tools.py); `not` and pipes are lit's own internal shell's."""

# ruff: noqa: F821  (lit defines `config` and `lit_config` before it runs this file)

import os
import sys
import tempfile

import lit.formats

sys.path.insert(0, os.path.dirname(__file__))
from run_tools import ember_opt, filecheck  # noqa: E402

config.name = "ember"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(tempfile.gettempdir(), "ember-lit")  # not in the tree
config.substitutions += [(r"\bember opt\b", ember_opt()), (r"\bfilecheck\b", filecheck())]
