"""The plan report's figures agree with the plan's own records: the ring's
VMEM as the buffer table declares it, one HBM floor, times readable at any
size, and the costliest phases' streamed-ahead part. Zoo plans with their
geometry given (planning only, no search: a fraction of a second each)."""

import re

import pytest

from megakernel.cli.args import with_quantize
from megakernel.compiler import report
from megakernel.compiler.floors import floors
from megakernel.compiler.layout import mib, size_text
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.report_ring import ring_buffers
from megakernel.models import zoo

# (zoo name, cores, --quantize pairs, geometry): the geometries the search
# chose for these plans (qwen3-32b/8 and kimi-k2/16 from the CLI), fixed here
# so each plan takes no search.
CASES = {
    "qwen3-32b/8": ("qwen3-32b", 8, [], dict(bank_bytes=4 << 20, num_banks=12, kv_tile=1024)),
    # MLA's kv_a_proj is 576 columns: its tiles get auxiliary rings
    "kimi-k2/16-mxfp4": ("kimi-k2", 16, ["experts=mxfp4"],
                         dict(bank_bytes=2 << 20, num_banks=7, expert_slots=2, kv_tile=512,
                              moe_parallel=1)),
    # fp8_b128's scales: auxiliary rings of 2 and 4 rows, tiled as scratch
    "tiny-dense-fp8": ("tiny-dense", 1, ["dense=fp8_b128"], dict(bank_bytes=512 << 10,
                                                                num_banks=5, kv_tile=512)),
    "tiny-dense": ("tiny-dense", 1, [], dict(bank_bytes=512 << 10, num_banks=5, kv_tile=512)),
}


@pytest.fixture(scope="module")
def plans():
    out = {}
    for key, (name, cores, quantize, geometry) in CASES.items():
        model = with_quantize(zoo.model(name), quantize)
        out[key] = plan_model(model, devices=cores, batch=1, tokens=1, overrides=geometry)
    return out


@pytest.mark.parametrize("key", sorted(CASES))
def test_ring_total_is_the_ring_buffers(plans, key):
    """The Ring geometry section's total is the sum of the plan's ring.*
    buffers, byte for byte, and each of them is named there with its size;
    the layout the geometry search sizes (RingLayout.nbytes) is the same."""
    plan = plans[key]
    m = plan.memory
    bufs = ring_buffers(m)
    declared = sum(b.nbytes for b in bufs)
    assert m.ring.nbytes == declared
    text = report.terminal(plan)
    section = text.split("Ring geometry")[1].split("\n\n")[0]
    total = re.search(r"ring total: ([\d.]+ MiB) of VMEM \(([\d,]+) bytes", section)
    assert total, section
    assert int(total.group(2).replace(",", "")) == declared
    assert total.group(1) == mib(declared)
    for b in bufs:
        assert re.search(rf"{re.escape(b.name)}\b.*= {re.escape(size_text(b.nbytes))}", section), \
            b.name
    banks = m.buffer("ring.banks")
    r = m.ring
    assert (f"{r.num_banks} x {r.bank_rows}x{r.bank_cols} int32 words = {r.num_banks} x "
            f"{mib(banks.nbytes // r.num_banks)} = {mib(banks.nbytes)}") in section
    # the nominal bank_bytes times the banks is not given as the banks' VMEM
    nominal = m.geometry.num_banks * m.geometry.bank_bytes
    if nominal != banks.nbytes:
        assert f"= {mib(nominal)}" not in section


def test_ring_explains_the_bank_beyond_bank_bytes(plans):
    """qwen3-32b/8: 4 MiB tiles, 4.38 MiB banks: the report names the tile
    whose fold sets the bank's rows, and the fold adds up to them."""
    plan = plans["qwen3-32b/8"]
    r = plan.memory.ring
    section = report.terminal(plan).split("Ring geometry")[1]
    fold = re.search(r"'s (\d+)x(\d+)-word tile in (\d+) pieces of (\d+) columns "
                     r"\(the last (\d+) wide\) stacks to (\d+) rows", section)
    assert fold, section
    rows, cols, pieces, width, last, tall = map(int, fold.groups())
    assert width == r.bank_cols and tall == r.bank_rows == rows * pieces
    assert cols == (pieces - 1) * width + last
    assert r.bank_rows * r.bank_cols * 4 > plan.memory.geometry.bank_bytes


def test_kimi_aux_rings_are_in_the_total(plans):
    plan = plans["kimi-k2/16-mxfp4"]
    section = report.terminal(plan).split("Ring geometry")[1]
    assert len(plan.memory.ring.aux) == 2
    for i in range(2):
        line = next(ln for ln in section.splitlines() if f"ring.aux{i}:" in ln)
        assert "kv_a_proj.weight" in line and "laid out as" in line and "x640 =" in line


def _step_section(plan) -> list[str]:
    return report.terminal(plan).split("Step time")[1].split("\n\n")[0].splitlines()


def _ms(text: str) -> float:
    value, unit = text.split()
    return float(value) * (1e-3 if unit == "us" else 1.0)


@pytest.mark.parametrize("key", ["tiny-dense", "qwen3-32b/8"])
def test_one_hbm_floor_read_back_from_the_plan(plans, key):
    """One line names the HBM floor; its time and bytes are the plan's; every
    time of the section reads back to the plan's within its last printed
    digit, and none of a tiny model's reads 0.000 ms."""
    plan = plans[key]
    c, f = plan.cost, floors(plan)
    lines = _step_section(plan)
    hbm = [ln for ln in lines if "HBM floor:" in ln]
    assert len(hbm) == 1, hbm
    got = re.match(r"HBM floor: ([\d.]+ (?:ms|us)) \(([\d,]+) bytes read per core per step "
                   r"at ([\d.]+) TB/s nominal; ([\d.]+ (?:ms|us)) at 3.2 TB/s", hbm[0])
    assert got, hbm[0]
    assert int(got.group(2).replace(",", "")) == c.floor_bytes_per_core
    assert float(got.group(3)) == pytest.approx(plan.target.hbm_bw / 1e12, abs=0.005)
    for printed, want in ((got.group(1), c.floor_ms), (got.group(4), f.hbm_sustained_ms)):
        assert _ms(printed) == pytest.approx(want, rel=0.01), (printed, want)
    text = "\n".join(lines)
    assert "0.000 ms" not in text and " 0.001 ms" not in text
    step = re.search(r"modeled step time: ([\d.]+ (?:ms|us)) per step", text).group(1)
    assert _ms(step) == pytest.approx(c.step_ms, rel=0.01)
    binding = re.search(r"binding floor: (\w+) \(([\d.]+ (?:ms|us))\); modeled efficiency "
                        r"\(binding floor / modeled step\) ([\d.]+)%", text)
    assert binding.group(1) == f.binding
    assert _ms(binding.group(2)) == pytest.approx(f.floor_ms, rel=0.01)
    assert float(binding.group(3)) == pytest.approx(100 * f.efficiency, abs=0.05)


def test_costliest_phases_show_what_the_ring_streamed_ahead(plans):
    """qwen3-32b/8's MLP takes less than its own HBM time: the table shows the
    part the ring streamed during earlier phases (the plan's prefetched_s),
    says so, and each row's time adds up from its columns."""
    plan = plans["qwen3-32b/8"]
    section = report.terminal(plan).split("Costliest phases")[1].split("\n\n")[0]
    lines = section.splitlines()
    head = lines[2].split()
    assert "ahead" in head
    by_name = {p.name: p for p in plan.cost.phases}
    faster = 0
    for line in lines[4:]:
        cells = line.split()
        if cells[0] not in by_name:
            break
        row = dict(zip(["phase", "x", "mb", "hbm", "ahead", "mxu", "overhead", "wait", "time"],
                       cells))
        p = by_name[row["phase"]]
        hbm, ahead, time = float(row["hbm"]), float(row["ahead"]), float(row["time"])
        assert ahead == pytest.approx(p.prefetched_s * 1e6, abs=0.005)
        assert time == pytest.approx(max(hbm - ahead, float(row["mxu"]) + float(row["overhead"]))
                                     + float(row["wait"]), abs=0.02)
        faster += time < hbm
    assert faster, section
    assert "streamed during earlier phases" in section
    assert "time us = max(HBM us - ahead us, MXU us + overhead us) + wait us" in section
    # in markdown the note follows the table after a blank line, not as a row of it
    assert "|\n\nper occurrence, x times a step" in report.markdown(plan)
