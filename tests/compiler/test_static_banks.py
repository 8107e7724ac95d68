"""Constant ring banks: where the banks divide every layer's tiles, tile j of a
stack lands in the same bank at every layer, and the kernel indexes that bank
(and its semaphores) by a constant. The planner prefers such a bank count when
it costs no modeled time (compiler/choose_geometry.py)."""

import pytest

from megakernel.backends.pallas_tpu.kernels.ring import Segment, Stream, Tile
from megakernel.compiler import report
from megakernel.compiler.choose_geometry import TOLERANCE
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.ring_layout import banks_static, run_banks_static
from megakernel.models import zoo


@pytest.mark.parametrize("runs, banks, static", [
    (((0, 18, 1),), 6, True), (((0, 18, 1),), 9, True), (((0, 18, 1),), 8, False),
    # Qwen3.5's body: 3 Gated DeltaNet layers of 28 tiles, one attention layer of 26
    (((0, 28, 3), (28, 26, 1)), 2, True), (((0, 28, 3), (28, 26, 1)), 11, False),
    # a run of one layer needs only the repetition to be whole turns of the ring
    (((0, 28, 3), (28, 26, 1)), 14, False), (((0, 30, 3), (30, 30, 1)), 10, True),
    (((0, 7, 2), (7, 6, 1)), 4, False), (((0, 8, 2), (8, 4, 1)), 4, True)])
def test_banks_static(runs, banks, static):
    assert banks_static(runs, banks) is static


def _stream(runs, count, banks, steps=1, head=5):
    tiles = tuple(Tile(0, 0, 8, 0, 128) for _ in range(max(t0 + n for t0, n, _ in runs)))
    per_rep = sum(n * c for _, n, c in runs)
    layered = Segment(0, count, tiles, runs=runs if len(runs) > 1 or runs[0][2] > 1 else ())
    head_seg = Segment(count * per_rep, 1, tiles[:head], layered=False)
    return Stream(None, None, banks, (layered, head_seg), None, steps=steps)


@pytest.mark.parametrize("runs, banks", [
    (((0, 18, 1),), 6), (((0, 18, 1),), 8), (((0, 8, 2), (8, 4, 1)), 4),
    (((0, 8, 2), (8, 4, 1)), 3), (((0, 6, 3), (6, 9, 1)), 3),
    # some runs static, not all: a repetition of whole turns (Qwen3.5's body
    # over 11 banks; 20 tiles over 4), a run of several layers that is not
    (((0, 28, 3), (28, 26, 1)), 11), (((0, 7, 2), (7, 6, 1)), 4)])
def test_a_constant_bank_is_the_flat_index_modulo_the_banks(runs, banks):
    """Against the flat index of every (layer, tile): the constant, where there
    is one, is the bank the ring's flat numbering gives at every layer."""
    stream = _stream(runs, 4, banks)
    seg = stream.segments[0]
    found = 0
    for j in range(len(seg.tiles)):
        const = stream.constant_bank(0, j)
        c = next(c for t0, n, c in runs if t0 <= j < t0 + n)
        banks_seen = {stream.flat(0, k, j) % banks for k in range(4 * c)}
        if const is not None:
            found += 1
            assert banks_seen == {const}, (j, banks_seen, const)
    assert (found == len(seg.tiles)) is banks_static(runs, banks), found


def test_each_run_is_static_on_its_own():
    """Qwen3.5-27B's body on 8 cores at the planner's 11 banks: 110 tiles a
    repetition, so the attention layer's run finds each tile in one bank at
    every repetition; the Gated DeltaNet run (3 layers of 28) does not."""
    runs = ((0, 28, 3), (28, 26, 1))
    assert not run_banks_static(runs, 0, 11) and run_banks_static(runs, 28, 11)
    assert not run_banks_static(runs, 28, 11, steps=2, total=110 * 16 + 7)
    assert not run_banks_static(runs, 28, 12)
    stream = _stream(runs, 16, 11)
    assert [stream.constant_bank(0, j) for j in (0, 27, 28, 53)] == [None, None, 84 % 11, 109 % 11]


def test_several_steps_need_whole_turns_of_the_ring_per_step():
    """A call of N steps shifts each step's banks by the total modulo R."""
    assert _stream(((0, 18, 1),), 4, 6, steps=2, head=6).constant_bank(0, 5) == 5
    assert _stream(((0, 18, 1),), 4, 6, steps=2, head=5).constant_bank(0, 5) is None


def test_the_planner_takes_constant_banks_that_cost_no_time():
    """qwen3-8b on 4 cores: the planner's ring divides a layer's tiles (the
    report says so), and no bank count beside it of the same bank size is
    faster beyond the search's tolerance."""
    model = zoo.model("qwen3-8b")
    plan = plan_model(model, devices=4, batch=1, tokens=1)
    g = plan.memory.geometry
    stream = plan.memory.stream
    assert stream.static_banks(), g
    assert all(st.per_layer % g.num_banks == 0 for st in stream.stacks), g
    assert "a constant bank per tile" in report.terminal(plan)
    for n in (g.num_banks // 2, g.num_banks - 1):      # (more banks do not fit)
        other = plan_model(model, devices=4, batch=1, tokens=1,
                           overrides={"bank_bytes": g.bank_bytes, "num_banks": n})
        assert plan.cost.step_ms <= other.cost.step_ms * (1 + TOLERANCE), (n, g)
