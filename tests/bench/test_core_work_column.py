"""bench's compute column: libtpu's core work beside the cost model's compute
side, compared without the profile's DMA waits (bench/table.py ``_core_work``)."""

from bench import table

CLOCK = 2.203e9


def _row(modeled_ms, **cycles):
    return {"modeled_compute_ms": modeled_ms, "core_work_cycles": cycles,
            "core_work_ms": sum(cycles.values()) / CLOCK * 1e3}


def test_a_row_that_waits_on_its_expert_fetches_is_not_flagged():
    # qwen3-30b-a3b/8 at 231bf2c: 1.259 ms of core work, 0.858 of it stall,
    # against 0.404 ms modeled compute (its fetches are on the model's HBM side)
    row = _row(0.404, stall=0.858e-3 * CLOCK, mxu_push=0.401e-3 * CLOCK)
    assert table._core_work(row) == "1.259 (busy 0.401)"


def test_a_row_whose_busy_work_differs_is_flagged():
    row = _row(1.0, stall=0.1e-3 * CLOCK, mxu_push=1.5e-3 * CLOCK)
    assert table._core_work(row) == "1.600 (busy 1.500, x1.50 DIFFERS)"


def test_a_flagged_row_is_split_into_pushes_and_the_rest():
    # gemma-3-1b/1's units at 231bf2c (ms) against its modeled MXU and overheads
    row = _row(0.502, mxu_push=0.393e-3 * CLOCK, mxu_stream=0.440e-3 * CLOCK,
               vector=0.046e-3 * CLOCK, cross_lane=0.068e-3 * CLOCK, scalar=0.200e-3 * CLOCK,
               dma_issue=0.012e-3 * CLOCK, stall=0.100e-3 * CLOCK)
    row.update(model="gemma-3-1b", cores=1, modeled_mxu_ms=0.222, modeled_overhead_ms=0.280)
    assert table._differs(row)
    # busy 1.159 - 0.502 = 0.657 = pushes 0.171 + the rest 0.486
    assert table.why_differs(row) == (
        "gemma-3-1b/1: +0.657 = pushes +0.171 (0.393 against MXU 0.222) + the rest +0.486 "
        "(streaming 0.440, vector 0.046, cross-lane 0.068, scalar 0.200, DMA issue 0.012 "
        "against overheads 0.280)")
    text = table.render([row], {})
    assert "compute DIFFERS, by unit" in text and table.why_differs(row) in text
