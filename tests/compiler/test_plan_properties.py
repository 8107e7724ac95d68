"""The acceptance properties of the planner over random models, core counts,
batch sizes and tokens per step."""

import numpy as np
from compiler_cases import cached_plan, plan_cases
from hypothesis import given, settings

from megakernel import dtypes, quantize
from megakernel.compiler.buffers import Space
from megakernel.compiler.layout import itemsize, padded_bytes, scratch_bytes
from megakernel.compiler.schedule_collectives import overlapping_tiles
from megakernel.compiler.shard import gather_weights, moe_degrees, shard_model, shard_weights
from megakernel.ir.config import build
from megakernel.models.weights import init_weights


@settings(max_examples=30)
@given(plan_cases())
def test_no_program_point_exceeds_the_vmem_budget(case):
    plan = cached_plan(*case)
    m = plan.memory
    # (that the total fits the budget, plan_memory enforces by construction;
    # that the total is what the kernel declares and the compiler uses is
    # tests/backends/test_emit.py and test_aot*.py)
    assert m.vmem_total == m.vmem_declared + m.values_bytes
    for b in m.buffers:
        assert 0 <= b.first <= b.last < len(m.points), b
        if b.space == Space.VMEM and b.role == "scratch":
            # as Mosaic tiles scratch (tests/backends/test_aot_scratch_tiling.py)
            assert b.nbytes == scratch_bytes(b.shape, b.dtype), b
        elif b.space in (Space.VMEM, Space.HBM):
            assert b.nbytes == padded_bytes(b.shape, b.dtype), b
    assert m.smem_total <= plan.target.smem_bytes
    # The ring as declared (32-bit words) holds every tile at its bank's corner,
    # its rows packed into words, wide tiles folded.
    ring = m.ring
    assert m.buffer("ring.banks").shape == ring.shape and m.buffer("ring.banks").dtype == "int32"
    # no column piece narrower than the MXU where a tile is that wide (ring_layout)
    widest = max(t.words[1] for t in [t for s in m.stream.stacks for t in s.tiles]
                 + list(m.stream.head) if ring.bank_of(t) == 0)
    assert m.stream.mxu in (plan.target.mxu_size, plan.target.piece_cols)
    assert ring.bank_cols >= min(widest, m.stream.mxu), (ring.bank_cols, widest)
    for t in [t for s in m.stream.stacks for t in s.tiles] + list(m.stream.head):
        word_rows, cols = t.words            # the tile's bits, as 32-bit words per row
        bits = dtypes.of(t.dtype).bits       # (4-bit codes: two to a byte)
        assert word_rows * 32 == t.view[0] * bits and cols == t.view[1]
        if ring.bank_of(t) == 0:
            assert word_rows * -(-cols // ring.bank_cols) <= ring.bank_rows, t
        else:
            assert m.buffer(f"ring.aux{ring.bank_of(t) - 1}").shape == (
                ring.num_banks, t.rows * bits // 32, t.cols)


def _ring_params(plan, model):
    """Full names of ring-streamed weights, in the model's consumption order."""
    names = [n for n in model.params() if n.startswith("layers.")
             and plan.shard.param(n).channel == "ring"]
    return names + ["lm_head.weight"]       # a tied head: a transposed copy of the embedding


@settings(max_examples=30)
@given(plan_cases())
def test_stream_delivers_every_weight_byte_once_in_consumption_order(case):
    plan = cached_plan(*case)
    model = build(case[0])
    stream = plan.memory.stream
    entries = list(stream.expand())
    assert [e.index for e in entries] == list(range(stream.total))
    assert all(e.bank == e.index % stream.num_banks for e in entries)
    order = []
    for e in entries:
        if not order or order[-1] != e.param:
            order.append(e.param)
    assert order == _ring_params(plan, model)          # each weight once, in order
    cover = {}
    for e in entries:
        shape = plan.shard.param(e.param).shape
        grid = cover.setdefault(e.param, np.zeros(shape, np.int8))
        t = e.tile
        grid[t.row0:t.row0 + t.rows, t.col0:t.col0 + t.cols] += 1
        assert padded_bytes(t.words, "int32") <= stream.bank_bytes     # as the bank holds it
    for name, grid in cover.items():
        assert (grid == 1).all(), f"{name} not covered exactly once"
    # Layers of a stack repeat the same tile list; the stack offsets chain up.
    offset = 0
    for s in stream.stacks:
        assert s.offset == offset
        offset += s.count * s.per_layer
    assert stream.head_offset == offset
    # Every other weight has exactly one other way in.
    for name, p in plan.shard.full_names():
        assert p.channel in ("ring", "vector", "experts", "gather", "resident")
        if p.channel == "vector":
            buf = next(b for b in plan.memory.buffers if b.name.endswith(f"vec.{p.name}"))
            assert buf.shape == (2, 1, *p.shape)
    for e in plan.memory.experts:
        st = plan.shard.stacks[e.stack]
        width = next(w for node, *_, w in st.experts if node == e.node)
        assert e.chunk * e.chunks == width and e.chunk % 128 == 0
        assert e.max_distinct <= e.experts_local


@settings(max_examples=30)
@given(plan_cases())
def test_every_collective_lies_between_producer_and_consumer(case):
    plan = cached_plan(*case)
    cores = case[1]
    sites = plan.collectives.sites
    if cores == 1:
        assert sites == () and plan.collectives.specs == ()
        return
    names = {b.name for b in plan.memory.buffers}
    for spec in plan.collectives.specs:
        assert {b.name for b in spec.buffers} <= names
    for site in sites:
        assert site.producer_point < site.point < site.consumer_point, site
        assert site.sum_order == tuple(range(cores))
        for i in overlapping_tiles(site, plan.memory.stream):
            assert 0 <= i < plan.memory.stream.total
    per_layer = [s for s in sites if s.stack is not None]
    assert len(per_layer) == sum(len(st.reductions) for st in plan.shard.stacks)
    # Sequence numbers run 0, 1, 2, ... through the step, so parity alternates.
    # (k: a site's run-layer index, over its run's layers of every repetition)
    seqs = sorted(s.seq(k) for s in per_layer for k in range(s.per_step))
    first = 1 if plan.shard.embed == "vocab" else 0
    assert seqs == list(range(first, first + len(seqs)))
    # The ring runs ahead across layers and into the LM head: the tiles in
    # flight during the last layer's last all-reduce reach past the layer.
    stream = plan.memory.stream
    last = max(per_layer, key=lambda s: (s.stack, s.point))
    ss = stream.stacks[last.stack]
    flying = overlapping_tiles(last, stream, last.per_step - 1)
    layer_end = ss.offset + ss.count * ss.per_layer
    # the tile after the last one its producer consumed, in its last run-layer
    after = (ss.flat(last.per_step - 1, last.overlap_first - 1) + 1 if last.overlap_first
             else ss.offset + (ss.count - 1) * ss.per_layer)
    expected = min(stream.num_banks, stream.total - after)
    assert len(flying) == max(expected, 0)
    if flying and flying[-1] >= layer_end:
        assert stream.head_offset <= flying[-1] < stream.total


@settings(max_examples=25)
@given(plan_cases(max_cores=8))
def test_sharding_then_gathering_reconstructs_the_weights(case):
    config, devices = case[:2]
    model = build(config)
    weights = init_weights(model, seed=1)
    degrees = moe_degrees(model, devices)      # [devices] only, for experts kept whole
    for ep in sorted({min(degrees), max(degrees)}):
        plan = shard_model(model, devices, moe_parallel=ep)
        per_core = shard_weights(model, plan, weights)
        for core in per_core:
            for name, array in core.items():
                assert array.shape == plan.param(name).shape
        rebuilt = gather_weights(model, plan, per_core)
        assert rebuilt.keys() == weights.keys()
        for name in weights:
            parts = (("codes", "scales") if isinstance(weights[name], quantize.Packed)
                     else (None,))                 # a quantized weight: both of its arrays
            for part in parts:
                got, want = ((getattr(rebuilt[name], part), getattr(weights[name], part))
                             if part else (rebuilt[name], weights[name]))
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {part or ''}")


@settings(max_examples=20)
@given(plan_cases())
def test_cost_report_is_consistent(case):
    plan = cached_plan(*case)
    c = plan.cost
    assert "modeled" in c.label
    assert 0 < c.floor_ms <= c.step_ms
    assert 0 < c.efficiency <= 1
    assert np.isclose(c.tokens_per_s_per_user, case[3] / (c.step_ms / 1e3))
    for e in c.timeline:
        assert 0 <= e.start_us <= e.end_us <= c.step_ms * 1e3 * (1 + 1e-9)
