"""Gated DeltaNet through the generated kernel: equal to the reference (tokens,
logits, KV caches, conv histories, recurrent states), the state's DMAs equal
the plan's bytes, the fetch-ahead structure, and sharding errors."""

import dataclasses

import pytest

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.backends.pallas_tpu.codegen.load import compile_model
from megakernel.backends.pallas_tpu.codegen import emit
from megakernel.backends.pallas_tpu.check import trace_dmas as trace
from megakernel.compiler import report
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.ring_layout import run_banks_static
from megakernel.errors import ShardingError
from megakernel.ir.config import LinearAttentionConfig, ModelConfig, build
from megakernel.models.weights import init_weights

# Two repetitions of a 3:1 body, so the state of repetition 1 is fetched while
# repetition 0 runs, and the parity slots are both used.
HYBRID = ModelConfig(
    name="tiny-hybrid", vocab_size=256, hidden_size=128, num_layers=8, num_q_heads=2,
    num_kv_heads=1, head_dim=64, intermediate_size=256, norm_offset=True, qk_norm=True,
    rotary_dim=16, attn_output_gate=True, dtype="float32", max_seq_len=64,
    layer_types=(("linear_attention",) * 3 + ("full_attention",)) * 2,
    linear_attention=LinearAttentionConfig(2, 4, 32, 32, 4))

# Measured on 1 device, 2 steps of 2 tokens: logits 1.2e-6, caches and states
# 1.4e-6 (float32; the same sums in another order); with the state committed
# after the call (backends/pallas_tpu/kernels/state_commit.py, 2026-12-04) logits 1.4e-6 and
# states 1.9e-6.
STATE_TOL = 1e-5


def test_hybrid_kernel_equals_the_reference_with_its_states():
    model = build(HYBRID)
    plan = plan_model(model, devices=1, batch=2, tokens=2)
    result = check_kernel(model, plan, init_weights(model), steps=2)
    assert result.ok, result
    assert result.cache_max_err <= STATE_TOL, result


def test_a_ring_constant_for_the_attention_run_only():
    """8 banks of 32 KiB: a repetition streams 3 x 44 + 36 = 168 tiles, whole
    turns of the ring, so the attention layer's tiles sit in constant banks
    while the Gated DeltaNet run's move with the layer
    (ring_layout.run_banks_static); the kernel mixes both and still equals
    the reference across both repetitions and two steps."""
    model = build(HYBRID)
    plan = plan_model(model, devices=1, batch=2, tokens=2,
                      overrides={"bank_bytes": 32 * 1024, "num_banks": 8})
    runs = plan.memory.stream.stacks[0].runs
    assert runs == ((0, 44, 3), (44, 36, 1)), runs
    assert [run_banks_static(runs, t0, 8) for t0, _, _ in runs] == [False, True]
    assert "a constant bank for 72 of the layers' 336 tiles" in report.terminal(plan)
    result = check_kernel(model, plan, init_weights(model), steps=2)
    assert result.ok, result
    assert result.cache_max_err <= STATE_TOL, result


def test_state_dmas_are_the_plans_bytes(tmp_path):
    model = build(HYBRID)
    plan = plan_model(model, devices=2, batch=2, tokens=1)
    result = trace.trace_step(model, plan, init_weights(model), out_dir=tmp_path)
    want = sum(s.bytes_per_step for s in plan.memory.states)
    # Per core and GDN layer, float32: hist_q and hist_k [2 seqs, 3 rows, 1 key
    # head x 32], hist_v [2, 3, 2 value heads x 32], recurrent [2, 2, 32, 32],
    # read once (read only); the call's updates stored once: the conv rows
    # windows [2 seqs, 8 rows (3 history rows, then the call's 1), 32 | 32 |
    # 64] and per value head the update rows [2 seqs, 2 heads, 8 rows (the
    # call's 1, rounded up to 8), key 32 | update 32 | summed log-decay 32];
    # for 3 GDN nodes x 2 repetitions.
    per_layer = (2 * (2 * 3 * 32) + 2 * 3 * 64 + 2 * 2 * 32 * 32) * 4
    updates = (2 * 8 * (32 + 32 + 64) + 2 * 2 * 8 * (32 + 2 * 32)) * 4
    assert want == (per_layer + updates) * 3 * 2 == 239_616
    weights = trace.plan_weight_bytes(plan)
    for core in range(2):
        got = result.bytes_by_kind(core)
        assert got["state"] == want
        assert got["ring"] == weights["ring"] and got["vector"] == weights["vector"]
    text = report.terminal(plan)
    assert "Recurrent state" in text and f"{want:,} bytes" in text


def test_state_is_fetched_before_the_loop_and_drained_after_it():
    model = build(HYBRID)
    plan = plan_model(model, devices=1, batch=1, tokens=1)
    src = emit.render(model, plan)
    fetch, loop = src.index("gdn_lib.fetch("), src.index("def layer_s0(")
    drain, end = src.index("gdn_lib.drain("), src.index("jax.lax.fori_loop(0, 2, layer_s0")
    assert fetch < loop < end < drain
    # the body's run of 3 GDN layers is one loop: one step, one fetch, and
    # state operands of its 3 x 2 run-layers
    assert src.count("gdn_lib.step(") == 1 and src.count("gdn_lib.fetch(") == 1
    assert "jax.lax.fori_loop(0, 3, run_s0_l0, 0)" in src
    for o in plan.memory.operands:
        if o.role == "cache" and o.source.startswith("l0_gdn."):
            assert plan.memory.buffer(o.buffer).shape[0] == 3 * 2
    for b in plan.memory.buffers:
        if b.name.endswith(".recurrent") and b.space.value == "vmem":
            assert b.shape == (2, 1, 4, 32, 32)       # [parity, batch, value heads, dk, dv]
            first = plan.memory.first_point(0)
            assert (b.first, b.last) == (first, max(p.index for p in plan.memory.points
                                                     if p.stack == 0))


def test_key_heads_replicate_and_value_heads_split():
    model = build(dataclasses.replace(
        HYBRID, linear_attention=LinearAttentionConfig(2, 8, 32, 32, 4), num_q_heads=4,
        num_kv_heads=2))
    plan = plan_model(model, devices=4, batch=1, tokens=1)
    ss = plan.shard.stacks[0]
    q, v = ss.param("l0_q_proj.weight").splits[0], ss.param("l0_v_proj.weight").splits[0]
    assert (q.parts, q.div, q.stride) == (2, 2, 32)        # each key head on 2 cores
    assert (v.parts, v.div, v.stride) == (4, 1, 64)        # 2 value heads per core
    assert {r.producer for r in ss.reductions} >= {"l0_out_proj", "l3_o_proj"}
    states = {s.name: s.splits[0] for s in ss.states if s.node == "l0_gdn"}
    assert states["recurrent"].axis == 1 and states["recurrent"].stride == 2
    assert "each key head on 2 cores" in report.terminal(plan, buffers=False)


def test_an_impossible_split_says_what_to_change():
    model = build(dataclasses.replace(
        HYBRID, linear_attention=LinearAttentionConfig(2, 6, 32, 32, 4), num_q_heads=4,
        num_kv_heads=2))
    with pytest.raises(ShardingError) as info:
        plan_model(model, devices=4, batch=1, tokens=1)
    text = str(info.value)
    assert "_gdn.num_value_heads" in text and "num_value_heads=6" in text
    assert "[1, 2, 3, 6]" in text


def test_declared_vmem_is_the_plan_for_drawn_hybrids():
    """As tests/backends/test_emit.py, for drawn hybrid models: the module
    declares exactly the plan's VMEM, the GDN state buffers included."""
    import tempfile

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from megakernel.backends.pallas_tpu.codegen import load
    from megakernel.testing import hybrid_configs
    from tests.backends.test_emit import declared_vmem

    @settings(max_examples=8, deadline=None)
    @given(st.sampled_from([1, 2, 4]).flatmap(
        lambda d: st.tuples(st.just(d), hybrid_configs(cores=d), st.integers(1, 8),
                            st.integers(1, 4))))
    def prop(case):
        devices, card, batch, tokens = case
        model = build(card)
        plan = plan_model(model, devices=devices, batch=batch, tokens=tokens)
        assert any(b.name.endswith("gdn.recurrent") for b in plan.memory.scratch())
        with tempfile.TemporaryDirectory() as d:
            module = load.import_module(compile_model(model, plan, d))
            assert declared_vmem(module) == plan.memory.vmem_declared

    prop()
