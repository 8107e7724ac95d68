"""The LM head's loop over a contraction split across tiles: where a whole
column block of the head does not fit a bank, each column block is several row
tiles, and lm_head loops over those groups (backends/pallas_tpu/kernels/blocks.py
``head_loop``) instead of unrolling every tile."""

import dataclasses

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.backends.pallas_tpu.kernels import blocks as runtime
from megakernel.backends.pallas_tpu.kernels.ring import Tile
from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import build
from megakernel.models import zoo
from megakernel.models.weights import init_weights


def test_a_split_head_loops_over_its_groups_and_matches_the_reference():
    # hidden 256 x 512-column blocks of bf16 need 256 KiB: in 128 KiB banks
    # each block is two 128-row tiles; 5 banks, so the tile a group starts
    # R = 5 places on alternates between the two row tiles
    model = build(dataclasses.replace(zoo.card("tiny-dense"), vocab_size=4096))
    plan = plan_model(model, devices=1, batch=2, tokens=1,
                      overrides={"bank_bytes": 128 * 1024, "num_banks": 5})
    head, ring = plan.memory.stream.head, plan.memory.ring
    assert {(t.rows, t.cols) for t in head} == {(128, 512)} and len(head) == 16
    tiles = [Tile(0, t.row0, t.rows, t.col0, t.cols) for t in head]   # as emitted
    n, step, group = runtime.head_loop(tiles, ring.bank_cols, ring.num_banks)
    assert (group, step) == (2, (0, 512)) and n == (16 - 5) // 2
    result = check_kernel(model, plan, init_weights(model), steps=2)
    assert result.ok, result
