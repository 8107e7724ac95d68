"""`megakernel check MODEL --examples N --devices D --seed S` and `pytest --mk-seed S`
on the same property report the same shrunk counterexample, here of a kernel broken
on purpose (megakernel.testing.FAULTS)."""

import functools
import re

import pytest

from megakernel import cli
from megakernel.testing import properties
from tests.plugin.user_run import run_pytest

FAULT = "skip_attention_residual"
# decode_property marks the test mk_devices(D): plain `pytest` makes the devices.
TEST_FILE = """
from megakernel.models import zoo
from megakernel.testing.properties import decode_property

test_tiny_dense = decode_property(zoo.model("tiny-dense").truncated(1), examples=4,
                                  devices={devices}, fault="{fault}")
"""
COUNTEREXAMPLE = re.compile(r"CaseResult\(batch=\d+, tokens=\d+, .*?\) for start=\[[\d, ]*\] "
                            r"tokens=\[\[[\d, \]\[]*\]\]")


def counterexample(text: str) -> str:
    # The CLI wraps its error at 88 columns; pytest does not.
    found = COUNTEREXAMPLE.findall(" ".join(text.split()))
    assert found, text[-3000:]
    return re.sub(r"max_rel_err=[^,]*, ", "", found[-1])


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
def test_cli_and_pytest_report_the_same_counterexample_for_a_seed(tmp_path, monkeypatch,
                                                                   capsys, devices):
    (tmp_path / "test_reproduce_cli.py").write_text(
        TEST_FILE.format(devices=devices, fault=FAULT))
    proc = run_pytest(tmp_path, "--mk-seed", "3")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"megakernel: {devices} virtual CPU device(s)" in proc.stdout
    from_pytest = counterexample(proc.stdout)

    # The CLI has no fault option: it is injected where the CLI calls the property.
    monkeypatch.setattr(properties, "check_examples",
                        functools.partial(properties.check_examples, fault=FAULT))
    code = cli.main(["check", "tiny-dense", "--layers", "1", "--examples", "4",
                     "--devices", str(devices), "--seed", "3"])
    assert code == 2
    from_cli = counterexample(capsys.readouterr().err)
    assert from_cli == from_pytest
    assert "start=[" in from_cli and "batch=1, tokens=1" in from_cli
