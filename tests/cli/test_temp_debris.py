"""A check leaves nothing in the temp directory (issue 9): the kernels it writes
for itself are removed when it ends."""

import os
import subprocess
import sys

import pytest


def check_in(tmpdir, *argv):
    env = dict(os.environ, TMPDIR=str(tmpdir))
    return subprocess.run([sys.executable, "-m", "megakernel.cli", "check", *argv],
                          capture_output=True, text=True, env=env, timeout=300)


def test_a_check_leaves_nothing_in_the_temp_directory(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = check_in(tmpdir, "tiny-dense", "--layers", "1", "--steps", "1")
    assert proc.returncode == 0 and proc.stdout.startswith("PASS"), proc.stderr
    assert list(tmpdir.iterdir()) == []


def test_drawn_examples_leave_nothing_in_the_temp_directory(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    proc = check_in(tmpdir, "tiny-dense", "--layers", "1", "--examples", "1")
    assert proc.returncode == 0 and "1 drawn case(s) agree" in proc.stdout, proc.stderr
    assert list(tmpdir.iterdir()) == []


def test_a_failing_check_removes_its_kernel_too(tmp_path, monkeypatch):
    import tempfile
    from pathlib import Path

    from megakernel.backends.pallas_tpu.check import kernel_check as run
    from megakernel.compiler.pipeline import plan_model
    from megakernel.models import load_model

    seen = []

    def runner_that_fails(module, *args, **kw):
        seen.append(Path(module.__file__))
        assert seen[0].is_file()        # the kernel was written under tmp_path ...
        raise RuntimeError("the kernel failed")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(run, "KernelRunner", runner_that_fails)
    model = load_model("tiny-dense").truncated(1)
    with pytest.raises(RuntimeError, match="the kernel failed"):
        run.check(model, plan_model(model), {}, steps=1)
    assert seen and seen[0].is_relative_to(tmp_path)
    assert list(tmp_path.iterdir()) == []   # ... and removed although the check failed
