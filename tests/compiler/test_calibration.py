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
    """The project's platform notes ("Compute at decode sizes": probes outside this
    repository, written independently of `megakernel calibrate`): 2^19 flop/cycle,
    2,048 bf16 and 4,096 fp8 weights per cycle, transposed pushes at half rate,
    one DMA at 1,688 B/cycle."""
    cal = calibration.load()
    assert cal.rate("flops_per_cycle") == 2**19
    assert cal.weights_per_cycle("bfloat16", False, "t") == 2048
    assert cal.weights_per_cycle("bfloat16", True, "t") == 1024
    assert cal.weights_per_cycle("float8_e4m3fn", False, "t") == 4096
    assert round(cal.rate("dma_bytes_per_cycle")) == 1688
    assert round(cal.rate("clock_hz") / 1e6) == 2203


def test_each_format_runs_its_cheapest_measured_path():
    """Every quantized format is measured through every MXU path the kernel has
    for its codes (``Format.mxu_paths``; dequant.matmul: decode, scales, dot,
    each path reading its own word layout), and its own path (``Format.mxu``,
    which the cost model and the core floor read) is the fastest measured, so
    a libtpu that reverses a choice fails here. libtpu 0.0.51, weights per
    cycle, own path vs the other: fp8_b128 4,681 (float8, block-diagonal)
    vs 224 (bf16 decode); mxfp4 4,539 vs 218; nvfp4 2,196 vs 214; int4_g32 /
    g64 / g128 4,681 each (float8, u = c + 8) vs 889 / 940 / 952; int8
    2,081 (scaled after the dot, bitcast codes) vs 978 (dequant)."""
    cal = calibration.load()
    quantized = [f for f in formats.FORMATS.values() if not f.plain]
    for f in quantized:
        own, *others = f.mxu_paths
        assert own == f.mxu
        rate = cal.weights_per_cycle(f"q.{f.name}", False, "t")
        for path in others:
            other = cal.weights_per_cycle(f"q.{f.name}_{path}", False, "t")
            assert rate > other, (f.name, f.mxu, rate, path, other)
        assert cost.format_factor(f.name) == 2048 / rate
    assert formats.get("fp8_b128").mxu == "fp8"
    assert formats.get("int8").mxu_paths == ("scaled", "dequant")
    assert cal.weights_per_cycle("q.fp8_b128", False, "t") > cal.weights_per_cycle(
        "bfloat16", False, "t")


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
    from megakernel.backends.pallas_tpu.aot.calibrate import measure

    got = measure(["matmul.bfloat16.kn"], timeout=300)
    assert got["matmul.bfloat16.kn"] == calibration.load().measurements["matmul.bfloat16.kn"]


def test_a_ring_piece_as_wide_as_every_mxu_runs_at_full_rate():
    """The ring's narrowest column piece is ``Target.piece_cols`` (every MXU of
    the core side by side) because pieces are ordered by their DMA waits: one
    MXU wide loads weights at half the rate, and a piece narrower than one MXU
    pays ~10x the fixed cycles (libtpu 0.0.51: 1,038 weights a cycle at 256
    columns, 2,092 at 512, 2,061 at 1,024; 263 fixed cycles at 128 columns, 24
    at 512)."""
    cal = calibration.load()
    target = make_target("tpu7x")
    assert target.piece_cols == 2 * target.mxu_size == 512

    def rate(width):
        return cal.rate(f"ring_piece_weights_per_cycle.{width}")

    def fixed(width):
        return cal.rate(f"ring_piece_cycles.{width}")
    assert rate(target.mxu_size) < 0.55 * rate(target.piece_cols)
    assert rate(target.piece_cols) > 0.9 * rate(1024)
    assert fixed(128) > 5 * fixed(target.piece_cols)
