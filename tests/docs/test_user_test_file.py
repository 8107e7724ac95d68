"""The test files shown in docs/property-testing.md run and pass with plain
``pytest``, as a user runs them: in a fresh folder, in a subprocess, with no
XLA_FLAGS or JAX_PLATFORMS set (the package's pytest plugin makes the devices)."""

import re
from pathlib import Path

import pytest

from tests.plugin.user_run import run_pytest

DOC = Path(__file__).parents[2] / "docs" / "property-testing.md"


def doc_file(name: str) -> str:
    """The ```python block of the docs that starts with ``# name``."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    (block,) = [b for b in blocks if b.startswith(f"# {name}\n")]
    return block


def _run_doc_file(tmp_path, devices: int):
    text = doc_file("test_my_model.py")
    assert "pytest.mark.mk_devices(1)" in text
    (tmp_path / "test_my_model.py").write_text(
        text.replace("mk_devices(1)", f"mk_devices({devices})"))
    proc = run_pytest(tmp_path, "test_my_model.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout
    assert f"megakernel: {devices} virtual CPU device(s)" in proc.stdout, proc.stdout[-2000:]


def test_user_test_file_passes(tmp_path):
    _run_doc_file(tmp_path, 1)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [2, 4])
def test_user_test_file_passes_on_more_devices(tmp_path, devices):
    _run_doc_file(tmp_path, devices)


@pytest.mark.slow
def test_layer_pattern_file_passes_on_two_devices(tmp_path):
    (tmp_path / "test_my_pattern_model.py").write_text(doc_file("test_my_pattern_model.py"))
    proc = run_pytest(tmp_path, "test_my_pattern_model.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout
    assert "megakernel: 2 virtual CPU device(s) (the mk_devices markers)" in proc.stdout


@pytest.mark.slow
def test_hybrid_model_file_passes_on_two_devices(tmp_path):
    """Issue 16: the docs' hybrid (Gated DeltaNet) file, 2 devices, plain pytest
    (47 s here: one kernel, two draws)."""
    (tmp_path / "test_my_hybrid_model.py").write_text(doc_file("test_my_hybrid_model.py"))
    proc = run_pytest(tmp_path, "test_my_hybrid_model.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout
    assert "megakernel: 2 virtual CPU device(s) (the mk_devices markers)" in proc.stdout
