"""Every `EMBER_*` environment switch, declared once: its name, type, default, what it does
and whether it changes the code a backend generates. Modules read a switch through its
declaration (`NUM_THREADS.get()`), never through `os.environ` (tests/test_settings.py
fails on such a read elsewhere): the value is read at each call, so a test's
`monkeypatch.setenv` takes effect, and a value the switch does not accept raises
`SettingError`, naming the variable and what it accepts. An unset or empty variable is
its default. The compile cache's key holds the value of every switch declared with
`changes_code` (`code_values`), so a new one cannot give a stale hit. `ember --help-env`
prints `describe()`; the README's table is `markdown()` (a test keeps it so). A leaf
module: it imports nothing of ember, and every layer may import it."""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingError(ValueError):
    """An `EMBER_*` variable set to a value its switch does not accept."""


@dataclass(frozen=True)
class Switch(Generic[T]):
    """One environment switch. `kind`: bool, int, float, path or choice (one of `choices`);
    `shown`: the default as the help prints it, where `default` (None) stands for a value
    computed where the switch is read."""

    name: str
    kind: str
    default: T
    help: str
    changes_code: bool = False
    choices: tuple[str, ...] = ()
    shown: str | None = None

    def get(self) -> T:
        """The value now in the environment, parsed; the default when unset or empty."""
        raw = os.environ.get(self.name, "")
        return self.default if raw == "" else self.parse(raw)

    def parse(self, raw: str) -> T:
        value = _PARSE[self.kind](self, raw)
        if value is None:
            raise SettingError(f"{self.name}={raw!r}: expected {self.accepts()} "
                               f"({self.help})")
        return value

    def accepts(self) -> str:
        return {"bool": "1 or 0 (also true/false, yes/no, on/off)", "int": "an integer",
                "float": "a number", "path": "a path",
                "choice": " or ".join(self.choices)}[self.kind]

    def default_text(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.kind == "bool":
            return "1" if self.default else "0"
        if self.default is None:
            return "unset"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


def _bool(s: Switch, raw: str) -> bool | None:
    low = raw.strip().lower()
    return True if low in _TRUE else False if low in _FALSE else None


def _int(s: Switch, raw: str) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


def _float(s: Switch, raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None


_PARSE = {"bool": _bool, "int": _int, "float": _float,
          "path": lambda s, raw: Path(raw),
          "choice": lambda s, raw: raw.strip() if raw.strip() in s.choices else None}

SWITCHES: dict[str, Switch] = {}


def _declare(switch: Switch[T]) -> Switch[T]:
    assert switch.name.startswith("EMBER_") and switch.name not in SWITCHES, switch.name
    assert switch.kind in _PARSE and (switch.kind == "choice") == bool(switch.choices)
    SWITCHES[switch.name] = switch
    return switch


# -- files and caches ------------------------------------------------------------------
CACHE: Switch[bool] = _declare(Switch(
    "EMBER_CACHE", "bool", True, "0: compile and load everything afresh (no compile, stage "
    "or data cache is read or written; the GEMM table is still read)"))
CACHE_DIR: Switch[Path | None] = _declare(Switch(
    "EMBER_CACHE_DIR", "path", None, "where compiled code, the GEMM cost table and the "
    "digits' copy are kept", shown="$XDG_CACHE_HOME/ember, else ~/.cache/ember"))

# -- the CPU backend: these change the generated code ------------------------------------
NUM_THREADS: Switch[int | None] = _declare(Switch(
    "EMBER_NUM_THREADS", "int", None, "threads for large CPU kernels (below 1: one)",
    changes_code=True, shown="the CPUs this process may use"))
GEMM: Switch[str] = _declare(Switch(
    "EMBER_GEMM", "choice", "auto", "the GEMM engine: ember's own, OpenBLAS, or by the "
    "measured cost table", changes_code=True, choices=("auto", "own", "blas")))
BLAS: Switch[bool] = _declare(Switch(
    "EMBER_BLAS", "bool", True, "0: never call OpenBLAS", changes_code=True))
AMX: Switch[bool] = _declare(Switch(
    "EMBER_AMX", "bool", True, "0: never use AMX tiles (bf16 GEMMs then use AVX512-BF16 "
    "where the CPU has it, else f32)", changes_code=True))
LLVM_UNROLL: Switch[bool] = _declare(Switch(
    "EMBER_LLVM_UNROLL", "bool", False, "1: let LLVM unroll loops (no measured gain, "
    "compiles 1.5-5x slower)", changes_code=True))
# its measurements reach the code only through the cost table, which the key holds
GEMM_TUNE: Switch[bool] = _declare(Switch(
    "EMBER_GEMM_TUNE", "bool", True, "0: never measure a GEMM size the cost table lacks "
    "(choose by size)"))

# -- looking inside --------------------------------------------------------------------
DUMP_IR: Switch[Path | None] = _declare(Switch(
    "EMBER_DUMP_IR", "path", None, "write every stage of every compile to this directory "
    "as .mlir"))
DUMP_LLVM: Switch[Path | None] = _declare(Switch(
    "EMBER_DUMP_LLVM", "path", None, "write each graph's LLVM IR before and after "
    "optimization and its assembly to this directory (bypasses the compile cache)"))
LLVM_REMARKS: Switch[bool] = _declare(Switch(
    "EMBER_LLVM_REMARKS", "bool", False, "1: LLVM's vectorization remarks on stderr"))
PASS_TIMING: Switch[bool] = _declare(Switch(
    "EMBER_PASS_TIMING", "bool", False, "1: compile time per IR pass and backend stage on "
    "stderr"))

# -- elsewhere -------------------------------------------------------------------------
DIST_TIMEOUT: Switch[float] = _declare(Switch(
    "EMBER_DIST_TIMEOUT", "float", 300.0, "seconds a collective waits for a peer "
    "(distributed.init's default timeout)"))
EMU_CACHE: Switch[Path | None] = _declare(Switch(
    "EMBER_EMU_CACHE", "path", None, "where the CUDA emulator keeps its compiled kernels",
    shown="$TMPDIR/ember-cuda-emu"))


def code_values() -> dict[str, object]:
    """The value of every switch that changes generated code, by name: part of the compile
    cache's key."""
    return {s.name: s.get() for s in SWITCHES.values() if s.changes_code}


def _type(s: Switch) -> str:
    return "|".join(s.choices) if s.kind == "choice" else s.kind


def describe() -> str:
    """What `ember --help-env` prints."""
    width = max(map(len, SWITCHES)) + 2
    lines = ["ember reads these environment variables (unset or empty: the default; a bool",
             "takes 1/0, true/false, yes/no or on/off):", ""]
    for s in SWITCHES.values():
        lines.append(f"  {s.name:<{width}}{_type(s)}, default {s.default_text()}"
                     + ("; changes generated code" if s.changes_code else ""))
        lines += textwrap.wrap(s.help, 96, initial_indent=" " * (width + 2),
                               subsequent_indent=" " * (width + 2))
    return "\n".join(lines)


def markdown() -> str:
    """The README's table of the switches."""
    rows = ["| variable | type | default | changes generated code | what it does |",
            "|---|---|---|---|---|"]
    for s in SWITCHES.values():
        kind = ", ".join(f"`{c}`" for c in s.choices) if s.choices else s.kind
        rows.append(f"| `{s.name}` | {kind} | {s.default_text()} | "
                    f"{'yes' if s.changes_code else ''} | {s.help} |")
    return "\n".join(rows)
