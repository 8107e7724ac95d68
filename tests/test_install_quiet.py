"""Quiet set-up: building the package prints no setuptools warning.

A warning there is a packaging mistake (an importable folder left out of
pyproject's packages, as the templates folder once was: setuptools then warns
that it ships the folder as data only) that every user sees on `make demo`.
The wheel is built as pip builds it, in an isolated environment; the one
notice an *editable* build always prints ("Editable installation ... folders
in your working directory") is about editable installs in general, not this
package, and the Makefile filters it by its message alone.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_building_the_wheel_prints_no_setuptools_warning(tmp_path):
    # Built from a copy: setuptools leaves build/ and *.egg-info in the tree it
    # builds, and the checkout must stay as the suite found it.
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__", "out"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(wheels.glob("megakernel-*.whl")), proc.stdout
    # Python's warning lines ("path:line: SetuptoolsWarning: ..."; pip shows
    # a build backend's as BuildBackendWarning), not pip's own "WARNING:" lines
    # about this machine's package index settings.
    warned = [line for line in (proc.stdout + proc.stderr).splitlines()
              if re.search(r"[a-z]Warning: ", line)]
    assert not warned, "\n".join(warned)


def test_the_makefile_filters_only_the_editable_notice():
    make = (ROOT / "Makefile").read_text()
    assert 'PYTHONWARNINGS="ignore:Editable installation"' in make
