"""settings.py: every EMBER_* switch declared once, read only through it (an AST scan of the
package), parsed at each read, listed by `ember --help-env` and the README, and every one
that changes generated code in the compile cache's key."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import tomllib
from pathlib import Path

import pytest

from ember import settings
from ember.__main__ import main
from ember.settings import SWITCHES, SettingError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def environ_reads(source: str) -> list[int]:
    """The lines of statements that touch os.environ or os.getenv and name an EMBER_*
    variable in the same statement (a loop's or an if's own expressions, not its body)."""
    out = []
    for stmt in ast.walk(ast.parse(source)):
        if not isinstance(stmt, ast.stmt):
            continue
        own = [node for field, value in ast.iter_fields(stmt)
               for node in (value if isinstance(value, list) else [value])
               if isinstance(node, ast.expr)]
        nodes = [n for e in own for n in ast.walk(e)]
        environ = any(isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv")
                      or isinstance(n, ast.Name) and n.id in ("environ", "getenv")
                      for n in nodes)
        named = any(isinstance(n, ast.Constant) and isinstance(n.value, str)
                    and n.value.startswith("EMBER_") for n in nodes)
        if environ and named:
            out.append(stmt.lineno)
    return out


def test_the_scan_finds_every_spelling_of_a_read():
    source = ('import os\nfrom os import environ, getenv\n'
              'a = os.environ.get("EMBER_A")\n'
              'b = os.environ["EMBER_B"]\n'
              'if "EMBER_C" in os.environ:\n    pass\n'
              'd = getenv("EMBER_D", "1")\n'
              'e = {k: environ.get(k) for k in ("EMBER_E", "EMBER_F")}\n'
              'os.environ["EMBER_G"] = "1"\n'
              'env = {**os.environ}\nenv.setdefault("EMBER_H", "1")\n'  # a child's: fine
              'x = os.environ.get("HOME")\n"""EMBER_I in a docstring"""\n')
    assert environ_reads(source) == [3, 4, 5, 7, 8, 9]


def test_no_module_but_settings_reads_an_ember_variable():
    """Over every module pyproject.toml installs (tests and benchmarks may set them)."""
    found = []
    for package in PACKAGES:
        for path in sorted(ROOT.joinpath(*package.split(".")[1:]).glob("*.py")):
            rel = path.relative_to(ROOT)
            if rel != Path("settings.py"):
                found += [f"{rel}:{line}" for line in environ_reads(path.read_text())]
    assert not found, ("read EMBER_* through ember.settings (declare a new switch there):\n"
                       + "\n".join(found))


def test_every_switch_is_declared_once_with_a_description():
    assert len(SWITCHES) >= 13
    for name, s in SWITCHES.items():
        assert re.fullmatch(r"EMBER_[A-Z_]+", name) and s.name == name
        assert s.help and "\n" not in s.help
        assert getattr(settings, name.removeprefix("EMBER_")) is s  # settings.NUM_THREADS
    assert {s.name for s in SWITCHES.values() if s.changes_code} >= {
        "EMBER_GEMM", "EMBER_BLAS", "EMBER_LLVM_UNROLL", "EMBER_NUM_THREADS"}


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_unset_or_empty_is_the_default(name, monkeypatch):
    s = SWITCHES[name]
    monkeypatch.delenv(name, raising=False)
    assert s.get() == s.default
    monkeypatch.setenv(name, "")
    assert s.get() == s.default


@pytest.mark.parametrize("name, raw, want", [
    ("EMBER_CACHE", "0", False), ("EMBER_CACHE", "1", True), ("EMBER_CACHE", "off", False),
    ("EMBER_PASS_TIMING", "1", True), ("EMBER_PASS_TIMING", "Yes", True),
    ("EMBER_LLVM_UNROLL", "true", True), ("EMBER_BLAS", "0", False),
    ("EMBER_NUM_THREADS", "3", 3), ("EMBER_NUM_THREADS", " 2 ", 2),
    ("EMBER_DIST_TIMEOUT", "2.5", 2.5), ("EMBER_GEMM", "own", "own"),
    ("EMBER_GEMM", "blas", "blas"), ("EMBER_CACHE_DIR", "/x/y", Path("/x/y"))])
def test_a_value_is_read_at_each_call(name, raw, want, monkeypatch):
    monkeypatch.setenv(name, raw)
    assert SWITCHES[name].get() == want


@pytest.mark.parametrize("name, raw, accepts", [
    ("EMBER_CACHE", "maybe", "1 or 0"), ("EMBER_NUM_THREADS", "four", "an integer"),
    ("EMBER_GEMM", "mkl", "auto or own or blas"), ("EMBER_DIST_TIMEOUT", "5s", "a number")])
def test_an_invalid_value_names_the_variable_and_what_it_accepts(name, raw, accepts,
                                                                 monkeypatch):
    monkeypatch.setenv(name, raw)
    with pytest.raises(SettingError, match=rf"^{name}='{raw}': expected {accepts}"):
        SWITCHES[name].get()
    assert issubclass(SettingError, ValueError)


def test_an_invalid_thread_count_fails_where_it_is_read(monkeypatch):
    from ember.backends.cpu.machine.host import num_threads

    monkeypatch.setenv("EMBER_NUM_THREADS", "many")
    with pytest.raises(ValueError, match="EMBER_NUM_THREADS='many'"):
        num_threads()
    monkeypatch.setenv("EMBER_NUM_THREADS", "0")
    assert num_threads() == 1  # as before: below 1 is one thread


# a value other than the default for each kind, to see the key change
_OTHER = {"bool": lambda s: "0" if s.default else "1", "int": lambda s: "7",
          "float": lambda s: "12.5", "path": lambda s: "/elsewhere",
          "choice": lambda s: next(c for c in s.choices if c != s.default)}


@pytest.mark.parametrize("name", sorted(s.name for s in SWITCHES.values() if s.changes_code))
def test_every_switch_that_changes_code_is_in_the_compile_cache_key(name, monkeypatch):
    from ember.backends.cpu.machine import cache

    for other in SWITCHES:
        monkeypatch.delenv(other, raising=False)
    before = cache.options(2)
    monkeypatch.setenv(name, _OTHER[SWITCHES[name].kind](SWITCHES[name]))
    assert cache.options(2) != before


def test_a_switch_that_does_not_change_code_leaves_the_key(monkeypatch):
    from ember.backends.cpu.machine import cache

    before = cache.options(2)
    for s in SWITCHES.values():  # EMBER_CACHE_DIR moves the GEMM table, keyed by content
        if not s.changes_code and s is not settings.CACHE_DIR:
            monkeypatch.setenv(s.name, _OTHER[s.kind](s))
    assert cache.options(2) == before


def test_help_env_lists_every_switch():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        main(["--help-env"])
    assert e.value.code == 0
    assert out.getvalue().strip() == settings.describe()
    for s in SWITCHES.values():
        assert re.search(rf"^  {s.name} ", out.getvalue(), re.M), s.name


def test_the_readme_table_is_the_declarations():
    readme = (ROOT / "README.md").read_text()
    assert settings.markdown() in readme, (
        "README.md's Environment table differs from settings.py: paste in the output of "
        "python -c 'from ember import settings; print(settings.markdown())'")
