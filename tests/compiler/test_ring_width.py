"""The weight ring's bank width: a column piece of a folded tile is the output
width of one matmul, waited for on its own, and libtpu schedules pieces
narrower than the core's MXUs side by side far slower (compiler/ring_layout.py,
docs/floors.md)."""

from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.ring_layout import _bank_rows_cols
from megakernel.models import zoo


def test_a_narrow_common_divisor_is_not_taken_for_the_width():
    # qwen3-32b on 8 cores, in words: gate/up 640 x 3200 bf16 tiles (320 word
    # rows), down 400 x 5120 (200), k/v 5120 x 128 (2560), q/o 1712 x 1024.
    shapes = {(320, 3200), (200, 5120), (2560, 128), (856, 1024)}
    assert _bank_rows_cols(shapes) == (8000, 128)          # smallest bank, MXU-blind
    rows, cols = _bank_rows_cols(shapes, mxu=256)
    assert cols == 256 and rows == 4160                    # 13 pieces of 320 rows
    assert rows * cols <= 1.05 * 8000 * 128                # 4% more VMEM


def test_tiles_narrower_than_the_mxu_keep_their_width():
    assert _bank_rows_cols({(64, 128), (32, 128)}, mxu=256) == (64, 128)


def test_a_tile_narrower_than_every_mxu_is_not_folded():
    assert _bank_rows_cols({(64, 256), (512, 128)}, mxu=512) == (512, 256)


def test_zoo_plan_banks_are_as_wide_as_every_mxu():
    for name, devices in (("qwen3-32b", 8), ("llama-3.2-1b", 1)):
        plan = plan_model(zoo.model(name), devices=devices)
        ring = plan.memory.ring
        assert plan.target.piece_cols == 512 and ring.bank_cols % 512 == 0, (name, ring)
