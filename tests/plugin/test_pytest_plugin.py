"""The pytest plugin as users meet it: plain ``pytest`` in a fresh folder, in a
subprocess, with none of the variables the project's conftest.py sets."""

import re
import textwrap
import xml.etree.ElementTree as ET

import pytest

from tests.plugin.user_run import run_pytest

MODEL = """
from megakernel.ir.config import ModelConfig, build

MODEL = build(ModelConfig(
    name="my-model", vocab_size=256, hidden_size=128, num_layers=1,
    num_q_heads=4, num_kv_heads=1, head_dim=128, intermediate_size=256,
    dtype="bfloat16", max_seq_len=128,
))
"""


def write(folder, name: str, text: str):
    (folder / name).write_text(textwrap.dedent(text))


def test_device_shortage_fails_at_once_naming_the_fix(tmp_path):
    """The issue's case: a 2-core check with no devices asked for. One call, not a
    search: the error names the expected and found counts and what to set."""
    write(tmp_path, "test_short.py", MODEL + """
from pathlib import Path
from hypothesis import given, settings
from megakernel.testing import assert_case, decode_cases

@settings(max_examples=20, deadline=None)
@given(decode_cases(MODEL, max_batch=4, max_tokens=2))
def test_two_cores(case):
    with open(Path(__file__).parent / "calls.txt", "a") as f:
        f.write("call\\n")
    assert_case(MODEL, case, devices=2)
""")
    proc = run_pytest(tmp_path, "test_short.py", "--junitxml=report.xml")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "megakernel set-up error (not a counterexample)" in out
    assert "need 2 devices for a 2-core kernel, found 1" in out
    assert "--mk-devices 2" in out and "pytest.mark.mk_devices(2)" in out
    assert "Falsifying example" not in out
    assert (tmp_path / "calls.txt").read_text().count("call") == 1
    (case,) = ET.parse(tmp_path / "report.xml").getroot().iter("testcase")
    assert float(case.get("time")) < 5.0, case.get("time")


def test_markers_set_the_devices_and_the_mesh(tmp_path):
    """The session gets the largest marker's count; each module's mesh its own."""
    write(tmp_path, "test_three.py", """
import jax
import pytest

pytestmark = pytest.mark.mk_devices(3)

def test_mesh(mk_mesh, mk_devices):
    assert mk_devices == 3 and mk_mesh.devices.size == 3 and mk_mesh.axis_names == ("x",)
    assert jax.device_count() == 3 and jax.devices()[0].platform == "cpu"
""")
    write(tmp_path, "test_unmarked.py", """
def test_mesh(mk_mesh, mk_devices):
    assert mk_devices == 1 and mk_mesh.devices.size == 1
""")
    proc = run_pytest(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "megakernel: 3 virtual CPU device(s) (the mk_devices markers)" in proc.stdout


def test_option_sets_the_devices_before_conftest_loads(tmp_path):
    write(tmp_path, "conftest.py", """
import os
assert "device_count=4" in os.environ["XLA_FLAGS"], os.environ.get("XLA_FLAGS")
assert os.environ["JAX_PLATFORMS"] == "cpu"
""")
    write(tmp_path, "test_four.py", """
import jax

def test_mesh(mk_mesh):
    assert mk_mesh.devices.size == 4 == jax.device_count()
""")
    proc = run_pytest(tmp_path, "--mk-devices", "4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "megakernel: 4 virtual CPU device(s) (--mk-devices)" in proc.stdout


MARKED_TWO = """
import pytest

@pytest.mark.mk_devices(2)
def test_two(mk_mesh):
    pass
"""

USAGE_ERRORS = {
    "option below a marker": (
        {"test_two.py": MARKED_TWO}, ["--mk-devices", "1"],
        "test_two.py::test_two (and 0 more) is marked mk_devices(2), but --mk-devices 1 "
        "was given; give --mk-devices 2"),
    "jax started by a conftest": (
        {"conftest.py": "import jax\njax.devices()\n", "test_two.py": MARKED_TWO}, [],
        "mk_devices markers needs 2 virtual devices, but jax started with 1 before the "
        "plugin could set the count"),
    "two markers in one module": (
        {"test_mixed.py": MARKED_TWO + "\n@pytest.mark.mk_devices(1)\n"
                                       "def test_one(mk_mesh):\n    pass\n"}, [],
        "mark the module once"),
    "count out of range": ({"test_two.py": MARKED_TWO}, ["--mk-devices", "0"],
                           "0 is out of range; give 1..32"),
    "marker not a count": ({"test_bad.py": MARKED_TWO.replace("(2)", "('two')")}, [],
                           "'two' is not an integer"),
}


@pytest.mark.parametrize("files, args, message", USAGE_ERRORS.values(), ids=USAGE_ERRORS)
def test_set_up_mistakes_stop_the_session_before_any_test(tmp_path, files, args, message):
    for name, text in files.items():
        write(tmp_path, name, text)
    proc = run_pytest(tmp_path, *args)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 4, out[-3000:]
    assert message in out, out[-3000:]
    if "conftest" in files:
        assert "XLA_FLAGS=--xla_force_host_platform_device_count=2" in out


def test_seed_option_repeats_the_draws(tmp_path):
    write(tmp_path, "test_drawn.py", """
from pathlib import Path
from hypothesis import given, settings, strategies as st

@settings(max_examples=15)
@given(st.integers(0, 10**9))
def test_draw(n):
    with open(Path(__file__).parent / "drawn.txt", "a") as f:
        f.write(f"{n}\\n")
""")
    draws = []
    for seed in ("5", "5", "6"):
        proc = run_pytest(tmp_path, "--mk-seed", seed)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"hypothesis seed {seed}" in proc.stdout
        draws.append((tmp_path / "drawn.txt").read_text())
        (tmp_path / "drawn.txt").unlink()
    assert draws[0] == draws[1] != draws[2]
    # No example database with a seed (hypothesis still caches source constants there).
    assert not (tmp_path / ".hypothesis" / "examples").exists()


def test_plugin_is_loaded_beside_the_projects_conftest(pytestconfig):
    """This suite runs with the plugin too: conftest.py's 8 devices stand."""
    import jax

    assert pytestconfig.pluginmanager.hasplugin("megakernel")
    assert jax.device_count() >= 8
    assert re.search(r"device_count=8\b", __import__("os").environ["XLA_FLAGS"])
