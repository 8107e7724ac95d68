"""The cost model charges a streamed tile by the width of its pieces
(compiler/piece_rates.py), at the rates `megakernel calibrate` measured."""

import pytest

from megakernel.compiler import calibration, piece_rates
from megakernel.compiler.calibration import RING_WIDTHS
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.ring_layout import RingLayout
from megakernel.compiler.weight_stream import Tile
from megakernel.models import zoo


def _cycles(width, rows):
    """A probed width's fitted rule, from the table itself."""
    cal = calibration.load()
    return (cal.rate(f"ring_piece_cycles.{width}")
            + rows * width / cal.rate(f"ring_piece_weights_per_cycle.{width}"))


def test_the_fit_reproduces_the_probes_cycles_per_piece():
    """Fixed cycles + weights / rate gives back each probe's cycles per piece
    (two points, two unknowns: exact), from the raw measurements."""
    cal = calibration.load()
    for w in RING_WIDTHS:
        for rows in calibration.RING_PIECE_ROWS:
            small, large = cal.measurements[f"ring_piece.{w}.{rows}"]
            pieces = calibration.ring_cols(w, rows) // w
            per_piece = (large - small) / (calibration.TILES_LARGE
                                           - calibration.TILES_SMALL) / pieces
            assert piece_rates.piece_cycles(w, rows) == pytest.approx(per_piece, rel=1e-9)


def test_other_widths_cost_the_slower_neighbours_rule():
    cal = calibration.load()

    def rule(probed, width, rows):
        return (cal.rate(f"ring_piece_cycles.{probed}")
                + rows * width / cal.rate(f"ring_piece_weights_per_cycle.{probed}"))
    assert piece_rates.piece_cycles(1152, 900) == max(rule(1024, 1152, 900),
                                                      rule(1536, 1152, 900))
    assert piece_rates.piece_cycles(64, 900) == rule(128, 64, 900)      # whole lanes
    assert piece_rates.piece_cycles(2880, 100) == rule(2048, 2880, 100)  # past the widest


def test_a_tile_costs_each_of_its_pieces():
    """A [640, 1280] tile in 512-column banks streams pieces 512, 512 and 256
    wide; at decode rows each costs its calibrated cycles, counted as one-dot
    bf16 elements (2,048 a cycle)."""
    cal = calibration.load()
    ring = RingLayout(4, 320, 512, (), 3)
    tile = Tile("w", 0, 640, 0, 1280, "bfloat16")
    cycles = 2 * _cycles(512, 640) + _cycles(256, 640)
    one_dot = cal.rate("mxu_weights_per_cycle.bfloat16.kn")
    assert piece_rates.mxu_elements([tile], ring, 8) == pytest.approx(cycles * one_dot)
    # With many more LHS rows than the MXU's flops take for its weight loads,
    # a piece costs its flops: the tile counts its own elements, at any width.
    rows = 16 * int(cal.rate("mxu_push_rows"))
    assert piece_rates.mxu_elements([tile], ring, rows) == pytest.approx(640 * 1280)


def test_the_head_phase_is_charged_its_pieces_at_the_calibrated_rates():
    """Independently of cost.py: the LM head's MXU time is the sum over its
    tiles' pieces of their calibrated cycles, at the calibrated clock (llama-3.2-1b's head has 512- and 256-column pieces)."""
    cal = calibration.load()
    plan = plan_model(zoo.model("llama-3.2-1b"), devices=1, batch=1, tokens=1)
    ring, cycles, widths = plan.memory.ring, 0.0, set()
    for t in plan.memory.stream.head:
        for c0 in range(0, t.cols, ring.bank_cols):
            w = min(ring.bank_cols, t.cols - c0)
            widths.add(w)
            cycles += piece_rates.piece_cycles(w, t.rows)
    head = next(p for p in plan.cost.phases if p.name == "lm_head")
    assert len(widths) > 1
    assert head.mxu_s == pytest.approx(cycles / cal.rate("clock_hz"), rel=1e-9)
