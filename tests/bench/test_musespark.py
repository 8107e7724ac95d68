"""Muse Spark against Inferact's measurements (bench/musespark.py): their plan
is what the planner plans under their options, every measured row is set beside
a modeled one, and a row further off than 15% is explained in the docs."""

from pathlib import Path

import pytest

from megakernel.compiler.floors import floors

from bench import musespark as M

MiB = 2**20
DOCS = Path(__file__).parents[2] / "docs" / "musespark.md"
NOTES = Path(__file__).parents[3] / "shared" / "notes" / "musespark.md"


@pytest.fixture(scope="module")
def rows():
    return M.inferact_rows()


def test_the_twelve_measured_rows_are_the_published_ones():
    # musespark.md's step-time table, transcribed: 3 configurations x B = 1, 2, 4, 8
    assert [len(v) for v in M.MEASURED.values()] == [4, 4, 4]
    if NOTES.exists():          # the notes live beside the checkout, not in it
        text = NOTES.read_text()
        for ms in M.MEASURED.values():
            for value in ms:
                assert f"{value:.3f}" in text, value


@pytest.mark.parametrize("config", list(M.CONFIGS))
@pytest.mark.parametrize("batch", M.BATCHES)
def test_their_plan_is_expressible(config, batch):
    """12 x 2 MiB ring banks, 4 expert slots, 256-row KV tiles, experts split by
    their FFN width over all 8 cores, within the 64 MiB VMEM of a TensorCore."""
    p = M.plan(config, batch, M.INFERACT)
    g = p.memory.geometry
    assert (g.num_banks, g.bank_bytes, g.expert_slots, g.kv_tile) == (12, 2 * MiB, 4, 256)
    assert p.shard.ep == 1 and {e[1:3] for st in p.shard.stacks for e in st.experts} == {(1, 8)}
    assert p.memory.vmem_total <= 64 * MiB
    assert p.cost.step_ms >= floors(p).hbm_sustained_ms


def test_every_row_is_within_15_percent_or_explained(rows):
    assert len(rows) == 12
    docs = DOCS.read_text()
    for r in rows:
        if abs(r["ratio"] - 1) > M.OFF:
            key = (r["config"], r["batch"])
            assert key in M.EXPLAINED, key
            assert M.EXPLAINED[key] in docs, M.EXPLAINED[key]


def test_phases_add_up_to_the_step():
    p = M.plan("int4 experts + bf16 dense", 1, M.INFERACT)
    ph = M.phases(p)
    layers = len(p.model.layers) * sum(ph["per_layer"].values())
    total = layers + ph["fixed"]["lm_head"] + ph["fixed"]["rest"]
    assert total == pytest.approx(p.cost.step_ms * 1e3, rel=1e-9)
    assert set(ph["per_layer"]) <= {"dense ring", "collectives", "experts", "attention",
                                    "vector ops"}
    assert ph["fixed"]["rest"] >= 0


@pytest.mark.parametrize("config", list(M.CONFIGS))
def test_the_planners_own_plan_is_no_slower_than_theirs_at_batch_1(config):
    """Under the same cost model the planner's own choices are at least as fast
    as Inferact's plan (the acceptance's 10% under their measurement is
    reported by make bench, TARGET, not asserted: not reached yet)."""
    own, theirs = M.plan(config, 1, M.OWN), M.plan(config, 1, M.INFERACT)
    assert own.cost.step_ms <= theirs.cost.step_ms
    assert own.cost.step_ms >= floors(own).hbm_sustained_ms


def test_render_prints_every_row(rows):
    rec = {"inferact": rows, "own": [], "aot": "skipped (test)"}
    text = "\n".join(M.render(rec))
    assert text.count("MODELED") >= 1
    for config in M.CONFIGS:
        assert text.count(config) == 4
