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
