"""Set-up problems are SetupErrors raised before a case runs, naming expected,
found and the fix; inside a hypothesis search they end it at the first call."""

import importlib.util
import time

import numpy as np
import pytest
from hypothesis import given, settings

from megakernel import cli
from megakernel.testing import preflight
from megakernel.errors import SetupError
from megakernel.ir.config import ModelConfig, build
from megakernel.models import zoo
from megakernel.testing.properties import assert_compiles, check_examples
from megakernel.testing import DecodeCase, assert_case, check_case, decode_cases

# Two query heads: plans for 1 or 2 cores, not 4.
TWO_HEADS = build(ModelConfig(name="two-heads", vocab_size=256, hidden_size=128, num_layers=1,
                              num_q_heads=2, num_kv_heads=1, head_dim=128,
                              intermediate_size=256, dtype="float32", max_seq_len=64))


def test_a_model_that_does_not_plan_for_the_cores_ends_the_search_at_once():
    calls = []

    @settings(max_examples=20, deadline=None, database=None)
    @given(decode_cases(TWO_HEADS, max_batch=2, max_tokens=2, max_context=32))
    def prop(case):
        calls.append(case)
        assert_case(TWO_HEADS, case, devices=4)

    t0 = time.perf_counter()
    with pytest.raises(preflight.SetupAbort) as info:
        prop()
    assert time.perf_counter() - t0 < 5.0 and len(calls) == 1
    text = str(info.value.error)
    assert "two-heads does not plan for 4 TensorCore(s)" in text
    assert "num_q_heads=2 cannot be split evenly over 4 TensorCores (use devices in [1, 2])" \
        in text
    assert "model_configs(cores=4)" in text


def test_outside_hypothesis_the_error_is_a_plain_setup_error():
    case = DecodeCase(np.zeros((1, 8), np.int32), np.array([3], np.int32),
                      np.ones((1, 1), np.int32))
    with pytest.raises(SetupError, match="does not plan for 4 TensorCore"):
        check_case(TWO_HEADS, case, devices=4)


def test_too_few_devices_names_expected_found_and_the_fix():
    import jax

    have = jax.device_count()
    with pytest.raises(SetupError) as info:
        preflight.require_devices(have + 1)
    text = str(info.value)
    assert f"need {have + 1} devices for a {have + 1}-core kernel, found {have}" in text
    assert f"--mk-devices {have + 1}" in text   # this suite runs with the plugin


def test_a_mesh_of_another_size_is_refused():
    from megakernel.backends.pallas_tpu.check.against_reference import make_mesh

    with pytest.raises(SetupError, match="the mesh has 2 devices, expected 4"):
        preflight.require_devices(4, mesh=make_mesh(2))


def test_the_cli_refuses_a_device_shortage_before_drawing(capsys):
    import jax

    n = jax.device_count() + 1
    t0 = time.perf_counter()
    code = cli.main(["check", "tiny-dense", "--layers", "1", "--examples", "3",
                     "--devices", str(n)])
    assert code == 2 and time.perf_counter() - t0 < 5.0
    assert f"need {n} devices for a {n}-core kernel" in capsys.readouterr().err


def test_check_examples_raises_setup_errors_before_any_case():
    with pytest.raises(SetupError, match="does not plan for 4 TensorCore"):
        check_examples(TWO_HEADS, examples=3, devices=4)


def test_no_libtpu_is_a_setup_error_naming_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "libtpu" else real(name, *a))
    with pytest.raises(SetupError) as info:
        assert_compiles(TWO_HEADS)
    assert "an AOT compile needs libtpu" in str(info.value)
    assert "pip install 'megakernel[tpu-aot]'" in str(info.value)


def test_a_topology_with_too_few_cores_is_a_setup_error():
    with pytest.raises(SetupError) as info:
        preflight.require_topology("tpu7x:1x1x1", "tpu7x", 4)
    assert "does not fit a plan for 4 tpu7x TensorCore(s)" in str(info.value)
    assert "tpu7x:2x1x1" in str(info.value)


@pytest.mark.aot
def test_assert_compiles_passes_for_a_tiny_model():
    pytest.importorskip("libtpu")
    result = assert_compiles(zoo.model("tiny-dense").truncated(1), devices=2, batch=2)
    assert 0 < result.vmem_used_bytes <= result.vmem_limit_bytes
