"""The generated calibration table: derived from libtpu's static profile, never typed."""

import importlib.metadata

import pytest

from megakernel import formats
from megakernel.compiler import calibration, cost
from megakernel.compiler.target import CALIBRATED, COST_TABLE, make_target
from megakernel.errors import PlanningError


def test_every_rate_is_derived_from_the_measured_cycles():
    cal = calibration.load()
    assert cal.header["libtpu"] == importlib.metadata.version("libtpu")
    assert cal.header["command"].startswith("megakernel calibrate")
    again = calibration.derive(cal.measurements, make_target("tpu7x").bf16_flops)
    assert again == cal.rates


def test_rates_agree_with_the_probes_of_platform_facts():
    """platform-facts.md ("Compute at decode sizes", shared/probes/compute_floor,
    written independently): 2^19 flop/cycle, 2,048 bf16 and 4,096 fp8 weights per
    cycle, transposed pushes at half rate, one DMA at 1,688 B/cycle."""
    cal = calibration.load()
    assert cal.rate("flops_per_cycle") == 2**19
    assert cal.weights_per_cycle("bfloat16", False, "t") == 2048
    assert cal.weights_per_cycle("bfloat16", True, "t") == 1024
    assert cal.weights_per_cycle("float8_e4m3fn", False, "t") == 4096
    assert round(cal.rate("dma_bytes_per_cycle")) == 1688
    assert round(cal.rate("clock_hz") / 1e6) == 2203


def test_each_format_runs_its_cheapest_measured_path():
    """Every quantized format has a calibrated rate of its own kernel path
    (dequant.matmul: decode, scales, dot; the cost model and the core floor
    read it). fp8_b128's codes go to the MXU as float8 with the scales after
    each 128-row dot: measured 4,369 weights per cycle (libtpu 0.0.51), above
    bf16's 2,048 and 43x its decode-to-bf16 path (101), which the kernel
    used before."""
    cal = calibration.load()
    rate = {fmt: cal.weights_per_cycle(f"q.{fmt}", False, "t") for fmt in
            ("int8", "int4_g32", "int4_g64", "int4_g128", "fp8_b128", "mxfp4")}
    assert formats.get("fp8_b128").mxu == "fp8"
    assert rate["fp8_b128"] > cal.weights_per_cycle("q.fp8_b128_dequant", False, "t")
    assert rate["fp8_b128"] > cal.weights_per_cycle("bfloat16", False, "t")
    assert cost.format_factor("fp8_b128") == 2048 / rate["fp8_b128"]


def test_the_cost_model_reads_the_table():
    cal = calibration.load()
    for name in CALIBRATED:
        assert COST_TABLE[name].value == cal.rate(name)
        assert COST_TABLE[name].source.startswith("calibrated: libtpu static profile")


def test_a_missing_rate_names_itself_and_the_command():
    with pytest.raises(PlanningError, match="calibrate_kernels.KERNELS") as err:
        calibration.load().weights_per_cycle("int2", False, "layers.3.q_proj")
    assert "layers.3.q_proj" in str(err.value) and "int2" in str(err.value)


def test_a_small_calibration_run_reproduces_the_table():
    """One micro-kernel, both sizes, compiled by libtpu with its profile (a few s)."""
    from megakernel.backends.pallas_tpu.calibrate import measure

    got = measure(["matmul.bfloat16.kn"], timeout=300)
    assert got["matmul.bfloat16.kn"] == calibration.load().measurements["matmul.bfloat16.kn"]
