"""The megakernel command as a user runs it: output, exit codes, no partial files."""

import subprocess
import sys
from pathlib import Path

import pytest

from megakernel.cli import main
from tests.cli.helpers import run
from tests.cli.test_check_line import read_tolerances


def test_show_prints_stacks_and_parameters(capsys):
    code, out, _ = run("show", "tiny-moe", capsys=capsys)
    assert code == 0
    assert "1-2        moe" in out and "parameters:" in out


def test_plan_prints_modeled_time_floor_and_efficiency(capsys):
    code, out, _ = run("plan", "tiny-moe", "--devices", "2", "--batch", "2", capsys=capsys)
    assert code == 0
    low = out.lower()
    assert "modeled" in low and "floor" in low and "efficiency" in low


def test_plan_json_is_the_plan(capsys):
    import json

    code, out, _ = run("plan", "tiny-dense", "--json", capsys=capsys)
    assert code == 0
    assert json.loads(out)["format"] == "megakernel.plan/1"


@pytest.mark.parametrize("argv, needle", [
    (["show", "no-such-model"], "neither a zoo name"),
    (["plan", "tiny-moe", "--devices", "3"], "cannot be split evenly over 3"),
    (["plan", "tiny-moe", "--vmem-budget", "1MiB"], "vmem"),
    (["check", "qwen3-32b", "--devices", "8"], "61.0 GiB of weights"),
    (["check", "qwen3-30b-a3b", "--examples", "2"], "--max-weights-gib"),
])
def test_bad_input_is_one_paragraph_and_exit_2(argv, needle, capsys):
    code, out, err = run(*argv, capsys=capsys)
    assert code == 2
    assert needle.lower() in err.lower()
    assert "Traceback" not in err


def test_debug_shows_the_traceback():
    proc = subprocess.run([sys.executable, "-m", "megakernel.cli", "--debug", "show", "nope"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_every_help_ends_with_examples():
    from megakernel.cli import COMMANDS

    for name in COMMANDS:
        proc = subprocess.run([sys.executable, "-m", "megakernel.cli", name, "--help"],
                              capture_output=True, text=True)
        assert proc.returncode == 0
        assert proc.stdout.rstrip().splitlines()[-1].strip().startswith("megakernel "), name
        assert "examples:" in proc.stdout


def test_failed_compile_leaves_nothing(tmp_path, capsys):
    out = tmp_path / "k"
    code, _, err = run("compile", "tiny-moe", "--devices", "3", "-o", str(out), capsys=capsys)
    assert code == 2
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def compiled_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "tiny-dense"
    assert main(["compile", "tiny-dense", "--devices", "2", "--batch", "2",
                 "--steps-per-call", "1", "-o", str(out)]) == 0
    return out


def test_compile_lets_the_planner_choose_steps_per_call(tmp_path):
    """No --steps-per-call: the planner's N (compiler/choose_steps.py), in the
    folder's request and under Choices in its report."""
    import json

    from megakernel.compiler.pipeline import plan_model
    from megakernel.models import zoo

    want = plan_model(zoo.model("tiny-dense"), devices=2, steps="auto").request.steps
    assert want > 1          # tiny-dense's launch is a large share of its step
    out = tmp_path / "auto"
    assert main(["compile", "tiny-dense", "--devices", "2", "-o", str(out)]) == 0
    assert json.loads((out / "request.json").read_text())["steps_per_call"] == want
    assert f"steps_per_call: auto: {want} " in (out / "plan.md").read_text()


def test_compile_writes_kernel_and_plan(compiled_dir):
    for name in ("kernel.py", "plan.json", "plan.md", "model.json", "request.json",
                 "manifest.json"):
        assert (compiled_dir / name).is_file(), name
    # the kernel, and its make_step handing it to the one pallas_call (runtime.make_step)
    src = (compiled_dir / "kernel.py").read_text()
    assert "def kernel(inputs, outputs, scratch):" in src and "rt.make_step(" in src


def test_check_a_compiled_dir(compiled_dir, capsys):
    code, out, _ = run("check", str(compiled_dir), "--steps", "1", capsys=capsys)
    assert code == 0 and out.startswith("PASS")
    # each tolerance with the relative bound and the reference's largest value it scales
    for bound, rel, scale in read_tolerances(out):
        assert rel > 0 and scale > 0 and rel * (1 + scale) == pytest.approx(bound, rel=1e-2)
    assert len(read_tolerances(out)) == 2


@pytest.mark.aot
def test_aot_a_compiled_dir(compiled_dir, capsys):
    code, out, _ = run("aot", str(compiled_dir), capsys=capsys)
    assert code == 0 and "VMEM used" in out and "(plan)" in out


def test_check_examples(capsys):
    code, out, _ = run("check", "tiny-dense", "--layers", "1", "--examples", "2", capsys=capsys)
    assert code == 0 and "2 drawn case(s) agree" in out


def test_check_hf_fixture(capsys):
    folder = str(Path(__file__).parents[1] / "fixtures" / "hf" / "qwen3")
    code, out, _ = run("check", folder, "--hf", folder, capsys=capsys)
    assert code == 0 and "decode_2" in out


def test_demo_runs_end_to_end(tmp_path, capsys):
    code, out, _ = run("demo", "-o", str(tmp_path / "demo"), "--steps", "1", capsys=capsys)
    assert code == 0
    assert "PASS" in out and "VMEM used" in out and "modeled step time" in out
