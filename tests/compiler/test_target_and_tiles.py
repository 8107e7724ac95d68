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
    assert _covers(tiles, 256, 1024)


def test_a_tied_head_streams_a_transposed_copy_of_the_embedding():
    """[hidden, vocab] like an untied head (full-rate MXU pushes); each core's
    copy is its vocabulary slice of the embedding, transposed, and gathering
    the cores' weights back yields the embedding alone."""
    import numpy as np

    from megakernel.compiler.shard import gather_weights, shard_model, shard_weights
    from megakernel.ir.config import ModelConfig, build
    from megakernel.models.weights import init_weights

    model = build(ModelConfig(name="tied", vocab_size=300, hidden_size=128, num_layers=1,
                              num_q_heads=2, num_kv_heads=1, head_dim=128,
                              intermediate_size=256, max_seq_len=64, dtype="float32",
                              tie_embeddings=True))
    plan = shard_model(model, 2)
    assert plan.global_param("lm_head.weight").full_shape == (128, 300)
    weights = init_weights(model, seed=0)
    assert "lm_head.weight" not in weights
    per_core = shard_weights(model, plan, weights)
    embed, s = weights["embed.weight"], plan.vocab_stride
    for core in range(2):
        n = plan.vocab_valid(core)
        assert np.array_equal(per_core[core]["lm_head.weight"][:, :n],
                              embed[core * s:core * s + n].T)
    back = gather_weights(model, plan, per_core)
    assert "lm_head.weight" not in back and np.array_equal(back["embed.weight"], embed)


def test_planner_doc_lists_every_constant():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    missing = [name for name in COST_TABLE if f"| {name} |" not in doc]
    assert not missing, f"docs/planner.md lacks constants {missing}"
