"""Targets come from pltpu; constants carry sources; tiles fit banks."""

import dataclasses

import pytest
from jax.experimental.pallas import tpu as pltpu

from megakernel.compiler.target import COST_TABLE, CostConstants, make_target
from megakernel.compiler.tile_weights import tile_matrix
from megakernel.errors import PlanningError


@pytest.mark.parametrize("chip, member, cores, topo", [
    ("tpu7x", "TPU_7X", 8, "tpu7x:2x2x1"), ("v6e", "TPU_V6E", 4, "v6e:2x2"),
    ("v5e", "TPU_V5E", 1, "v5e:1x1")])
def test_targets_read_the_chip_table(chip, member, cores, topo):
    info = pltpu.get_tpu_info_for_chip(getattr(pltpu.ChipVersion, member), 1)
    t = make_target(chip, cores)
    assert (t.vmem_bytes, t.hbm_bw, t.bf16_flops) == (
        info.vmem_capacity_bytes, info.mem_bw_bytes_per_second, info.bf16_ops_per_second)
    assert t.vmem_budget == info.vmem_capacity_bytes - 6 * 2**20
    assert t.topology.name == topo and t.cores == cores


def test_every_constant_has_a_source():
    fields = {f.name for f in dataclasses.fields(CostConstants)}
    assert fields == set(COST_TABLE)
    assert all(c.source and c.unit for c in COST_TABLE.values())


def test_bad_target_requests():
    with pytest.raises(PlanningError, match="chip='v9'"):
        make_target("v9")
    with pytest.raises(PlanningError, match="vmem_reserve"):
        make_target("tpu7x", 1, vmem_reserve=2**30)


def _covers(tiles, rows, cols):
    grid = [[0] * cols for _ in range(rows)]
    for t in tiles:
        for r in range(t.row0, t.row0 + t.rows):
            for c in range(t.col0, t.col0 + t.cols):
                grid[r][c] += 1
    return all(v == 1 for row in grid for v in row)


def test_matrix_larger_than_a_bank_is_row_tiled():
    tiles = tile_matrix("w", 512, 256, "bfloat16", 64 * 1024)
    assert len(tiles) == 4 and all(t.cols == 256 and t.rows == 128 for t in tiles)
    assert [t.row0 for t in tiles] == [0, 128, 256, 384]     # K order: accumulate
    assert _covers(tiles, 512, 256)


def test_wide_matrix_falls_back_to_column_blocks():
    tiles = tile_matrix("w", 64, 4096, "bfloat16", 64 * 1024)
    assert all(t.rows * t.cols * 2 <= 64 * 1024 for t in tiles)
    assert _covers(tiles, 64, 4096)


def test_head_tiles_are_vocab_blocks_over_the_whole_contraction():
    tiles = tile_matrix("lm_head.weight", 256, 1024, "bfloat16", 128 * 1024, "head")
    assert all(t.rows == 256 and t.cols % 128 == 0 for t in tiles)
    tied = tile_matrix("embed.weight", 1024, 256, "bfloat16", 128 * 1024, "tied_head")
    assert all(t.transposed and t.cols == 256 and t.rows % 128 == 0 for t in tied)
    assert _covers(tiles, 256, 1024) and _covers(tied, 1024, 256)


def test_planner_doc_lists_every_constant():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    missing = [name for name in COST_TABLE if f"| {name} |" not in doc]
    assert not missing, f"docs/planner.md lacks constants {missing}"
