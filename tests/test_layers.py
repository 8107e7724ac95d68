"""The house's layering: the package's import graph has no circle, and every
import points down the floors below (docs/architecture.md, "Layers").

An import is any ``import`` / ``from ... import`` statement anywhere in a module
(inside functions too: a lazy import is still an arrow), naming the deepest
module of the package it reaches; a package's ``__init__`` being run on the way
is not an arrow. Modules are read from the source folders as pyproject maps
them, so the test needs nothing imported.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]

# Floors, lowest first: (floor, module-name prefixes). A module's floor is that
# of its longest matching prefix; it may import its own floor and the floors
# below. Within one floor, arrows may go either way but never round (no circle).
FLOORS = (
    ("base", ("megakernel.errors", "megakernel.registry", "megakernel.dtypes",
              "megakernel.formats", "megakernel.quantize", "megakernel.activations",
              "megakernel.virtual_devices", "megakernel.chips", "megakernel")),
    ("ir", ("megakernel.ir",)),
    ("compiler", ("megakernel.compiler",)),
    ("backends", ("megakernel.backends",)),
    ("models", ("megakernel.models",)),
    # The check harness and the AOT profiles run kernels against the reference
    # (models/reference.py): they sit above both backends and models.
    ("harness", ("megakernel.backends.pallas_tpu.check", "megakernel.backends.pallas_tpu.aot")),
    # Every kind's rules, registered: imported by the entry points only.
    ("kinds", ("megakernel.kinds",)),
    ("testing", ("megakernel.testing",)),
    ("entry", ("megakernel.cli", "bench")),
)
# Arrows allowed against the order, each with its reason: none.
EXCEPTIONS: dict[tuple[str, str], str] = {}
MAX_LINES = 400     # no module outside tools/ longer than this


def _modules() -> dict[str, Path]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = dict(cfg["package-dir"])
    roots["bench"] = "bench"
    mods = {}
    for pkg, folder in roots.items():
        for f in (ROOT / folder).rglob("*.py"):
            rel = f.relative_to(ROOT / folder).with_suffix("")
            if any(p.startswith(".") for p in rel.parts):
                continue   # hidden folders: virtual environments (.venv, .venv-hf)
            parts = [p for p in rel.parts if p != "__init__"]
            if pkg == "megakernel" and parts and parts[0] in ("ir", "compiler", "backends",
                                                             "models"):
                continue
            mods[".".join([pkg, *parts])] = f
    return mods


def _graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    for name, f in mods.items():
        g.add_node(name)
        pkg = name if f.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != name:
                    g.add_edge(name, t, line=node.lineno)
    return g


def floor(module: str) -> int:
    best, level = -1, None
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, level = len(p), i
    assert level is not None, f"{module} is on no floor: add it to FLOORS"
    return level


def test_no_import_circle():
    circles = [sorted(c) for c in nx.strongly_connected_components(_graph()) if len(c) > 1]
    assert not circles, f"import circles: {circles}"


def test_every_import_points_down():
    g = _graph()
    wrong = [f"{a} ({FLOORS[floor(a)][0]}) imports {b} ({FLOORS[floor(b)][0]}), line "
             f"{g.edges[a, b]['line']}"
             for a, b in sorted(g.edges) if floor(b) > floor(a) and (a, b) not in EXCEPTIONS]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_the_base_imports_nothing_of_the_package_above_it():
    g = _graph()
    base = [m for m in g if floor(m) == 0]
    assert "megakernel.registry" in base
    assert all(floor(b) == 0 for m in base for b in g.successors(m))


def test_no_module_over_the_line_limit():
    skip = {"tools", "fixtures"}     # and hidden folders: .git, .venv, .venv-hf
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted(ROOT.rglob("*.py"))
            if not skip & set(parts := p.relative_to(ROOT).parts)
            and not any(part.startswith(".") for part in parts)
            and (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules over {MAX_LINES} lines (split by role): {long}"


def test_pyproject_lists_every_package():
    """A subpackage missing from pyproject's list installs without its modules."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {m for m, f in _modules().items() if f.name == "__init__.py" and not m.startswith("bench")}
    assert found - listed == set(), f"add to pyproject's packages: {sorted(found - listed)}"
