"""Every file a comment, docstring, message or doc cites exists.

Scans the repository's Python files (outside .venv and tests/fixtures), its
Markdown files (docs/*.md, README.md, bench/README.md), the Makefile, *.mk
and *.j2 files, line by line, for

- citations of repository files, ``<folder>/<path>.<py|md|json|j2|mk>`` with
  <folder> one of megakernel, ir, compiler, backends, models, bench, tools,
  tests, docs, given from the repository root, which must exist;
- citations of files outside the repository, scratch scripts under /tmp
  (``/tmp/proto/p3.py``) or paths up from it (``../shared/x.py``), which no
  reader of the repository has.

A file that moved is cited by its new path; a one-off script is described by
what it measured (or committed under tools/). The pattern only starts a path at
a folder name that follows no path character, so ``transformers/models/x.py``
or ``.venv/.../x.py`` are not read as ``models/x.py``.
"""

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FOLDERS = ("megakernel", "ir", "compiler", "backends", "models", "bench", "tools", "tests", "docs")
EXTENSIONS = ("py", "md", "json", "j2", "mk")
# A path ends at its extension, perhaps followed by a full stop, never by more of a name.
_END = rf"\.(?:{'|'.join(EXTENSIONS)})(?!\.?[\w-])"
CITED = re.compile(rf"(?<![\w./-])((?:{'|'.join(FOLDERS)})/[\w./-]*?{_END})")
OUTSIDE = re.compile(rf"(?<![\w./-])((?:/tmp/|\.\./)[\w./-]*?{_END})")
# Folders the code writes into and git ignores: a citation of an output there
# (bench/results/bench.json) names a file that exists once the tool has run.
OUTPUTS = ("bench/results/",)
SKIP = ("tests/fixtures", "build", "out")   # and every hidden folder (.venv, .git)


def scanned_files() -> list[Path]:
    """The files to scan, walking the tree without entering skipped or hidden folders
    (a full virtualenv holds tens of thousands of files)."""
    files = []
    for folder, subfolders, names in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT).as_posix()
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".")
                               and f"{rel}/{d}".removeprefix("./") not in SKIP)
        files += [Path(folder) / n for n in names
                  if n.endswith((".py", ".md", ".mk", ".j2")) or n == "Makefile"]
    return sorted(f for f in files if f != Path(__file__))   # this file's examples


def citations():
    """(file:line, cited path) of every citation in the scanned files."""
    for path in scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for pattern in (CITED, OUTSIDE):
                for match in pattern.finditer(line):
                    yield f"{rel}:{number}", match.group(1)


def outside(cited: str) -> bool:
    return cited.startswith(("/tmp/", "../"))


def missing(cited: str) -> bool:
    if outside(cited):
        return True
    return not cited.startswith(OUTPUTS) and not (ROOT / cited).exists()


def test_the_pattern_reads_citations_and_only_them():
    line = ("see docs/floors.md. and tools/profile_cut.py:12, (compiler/cost.py) and "
            "`tests/backends/golden/tiny_dense_2core.py.golden`, transformers/models/x.py, "
            "../shared/probes/x.py, megakernel.compiler.cost, out/tiny/kernel.py, /tmp/a/b.py")
    assert [m.group(1) for m in CITED.finditer(line)] == [
        "docs/floors.md", "tools/profile_cut.py", "compiler/cost.py"]
    assert [m.group(1) for m in OUTSIDE.finditer(line)] == ["../shared/probes/x.py",
                                                            "/tmp/a/b.py"]


def test_every_cited_file_exists():
    stale = [f"{where}: cites {cited}, which "
             + ("is outside the repository: no reader has it" if outside(cited)
                else "does not exist in the repository")
             for where, cited in citations() if missing(cited)]
    if stale:
        pytest.fail(f"{len(stale)} citation(s) of files that do not exist:\n  "
                    + "\n  ".join(stale)
                    + "\nCite a moved file by its new path (from the repository root); "
                      "describe a one-off or outside script by what it measured, or commit "
                      "it under tools/.", pytrace=False)
