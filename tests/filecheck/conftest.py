"""Runs the `.mlir` files here as tests, as lit does (and `lit tests/filecheck` does, with
lit.cfg.py): every `// RUN:` line is a bash command in which `ember opt` is this Python's
`python -m ember opt`, `filecheck` the filecheck package's executable, `not CMD`
succeeds when CMD fails, and `%s` the file's path.
A trailing `\\` continues a RUN line. A failure shows the text filecheck was given and
what the command printed.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest
from run_tools import ember_opt, filecheck

PRELUDE = "set -o pipefail\nnot() { if \"$@\"; then return 1; else return 0; fi; }\n"
# a tool name where a command starts: line start, after | ; & ( or after `not`
TOOL = re.compile(r"(^|[|;&(]\s*|\bnot\s+)(ember\s+opt|filecheck)\b")


def run_lines(text: str) -> list[str]:
    runs, cur = [], None
    for line in text.splitlines():
        m = re.search(r"//\s*RUN:(.*)$", line)
        if not m:
            continue
        part = m.group(1).strip()
        cur = part if cur is None else f"{cur} {part}"
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
        else:
            runs.append(cur)
            cur = None
    return runs


def substitute(command: str, path: Path, seen: Path) -> str:
    """The bash command; what reaches each filecheck is also appended to `seen`."""
    tools = {"filecheck": f"tee -a {shlex.quote(str(seen))} | {filecheck()}",
             "opt": ember_opt()}
    command = TOOL.sub(lambda m: m.group(1) + tools[m.group(2).split()[-1]], command)
    return command.replace("%s", shlex.quote(str(path)))


class RunFailed(Exception):
    pass


class MlirFile(pytest.File):
    def collect(self):
        runs = run_lines(self.path.read_text())
        if not runs:
            raise pytest.UsageError(f"{self.path}: no '// RUN:' line")
        for i, command in enumerate(runs):
            name = "RUN" if len(runs) == 1 else f"RUN{i + 1}"
            yield MlirRun.from_parent(self, name=name, command=command)


class MlirRun(pytest.Item):
    def __init__(self, *, command: str, **kwargs):
        super().__init__(**kwargs)
        self.command = command

    def runtest(self):
        with tempfile.TemporaryDirectory() as tmp:
            seen = Path(tmp) / "input"
            seen.touch()
            script = substitute(self.command, self.path, seen)
            r = subprocess.run(["bash", "-c", PRELUDE + script], capture_output=True,
                               text=True, timeout=300)
            if r.returncode:
                raise RunFailed(f"RUN: {self.command}\nexit status {r.returncode}\n"
                                f"--- input to filecheck ---\n{seen.read_text()}"
                                f"--- stdout ---\n{r.stdout}--- stderr ---\n{r.stderr}")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, RunFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"{self.path.name}: {self.command}"


def pytest_collect_file(parent, file_path: Path):
    if file_path.suffix == ".mlir":
        return MlirFile.from_parent(parent, path=file_path)
