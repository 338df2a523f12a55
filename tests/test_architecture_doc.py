"""docs/ARCHITECTURE.md and CONTRIBUTING.md stay true: every file path they write exists
(and every `path:name` names a def, class or assignment there), their links resolve, the
architecture's layer table is the import test's, and README and CONTRIBUTING link to it."""

import re
from pathlib import Path

import pytest
from test_import_layers import ALLOWED

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
DOCS = [ARCHITECTURE, ROOT / "CONTRIBUTING.md"]
PATH = re.compile(r"[\w./-]+")


def _paths(text: str) -> list[tuple[str, str | None]]:
    """(path, name or None) of each code span that is a path: it has a slash or ends in a
    file suffix, optionally followed by `:name` (a span such as `x.sign()` is no path)."""
    out = []
    for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
        path, _, name = span.partition(":")
        if PATH.fullmatch(path) and re.search(r"\w/|\.(py|md|mlir|toml)$", path):
            out.append((path, name or None))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_exists(doc):
    missing = []
    for path, name in _paths(doc.read_text()):
        file = ROOT / path
        if not file.exists():
            missing.append(path)
        elif name and not re.search(rf"^\s*(def|class) {re.escape(name.split('.')[0])}\b|"
                                    rf"^{re.escape(name)}\s*[:=]", file.read_text(), re.M):
            missing.append(f"{path}:{name}")
    assert not missing, f"{doc.name} names what does not exist: {', '.join(missing)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_resolves(doc):
    targets = re.findall(r"\]\(([^)#\s]+)", doc.read_text())
    assert not [t for t in targets if "://" not in t and not (doc.parent / t).exists()]


def test_the_layer_table_is_the_import_tests():
    rows = {}
    for line in ARCHITECTURE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([\w./]+)`", cells[0]) if len(cells) == 3 else []
        if names:
            layer = names[0].rstrip("/").removesuffix(".py")
            rows[layer] = set() if cells[2] == "nothing" else set(re.split(r",\s*", cells[2]))
    for layer, allowed in ALLOWED.items():
        assert rows.get(layer) == allowed - {layer}, f"the row of {layer}"


@pytest.mark.parametrize("doc", ["README.md", "CONTRIBUTING.md"])
def test_readme_and_contributing_link_to_it(doc):
    assert "](docs/ARCHITECTURE.md)" in (ROOT / doc).read_text()
