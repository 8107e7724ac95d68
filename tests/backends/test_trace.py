"""Trace mode: the DMAs one step executes equal the plan's weight stream."""

import numpy as np
import pytest

from megakernel.backends.pallas_tpu.check import trace_dmas as trace
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.shard import shard_weights
from megakernel.ir.config import MLAConfig, ModelConfig, build
from megakernel.models import zoo
from megakernel.models.weights import init_weights



@pytest.mark.parametrize("devices", [1, 2])
def test_dense_step_reads_every_weight_byte_once(devices, tmp_path):
    model = zoo.model("tiny-dense")
    plan = plan_model(model, devices=devices, batch=2, tokens=1)
    weights = init_weights(model)
    result = trace.trace_step(model, plan, weights, out_dir=tmp_path)
    want = trace.plan_weight_bytes(plan)
    for core in range(devices):
        got = result.bytes_by_kind(core)
        assert got["ring"] == want["ring"]
        assert got["vector"] == want["vector"]
        shard = shard_weights(model, plan.shard, weights)[core]
        streamed = sum(a.nbytes for k, a in shard.items()
                       if k not in ("embed.weight", "final_norm.weight"))
        assert got["ring"] + got["vector"] == streamed
    # every token's aligned block of 16 bf16 rows is gathered once, by its owner
    embed = sum(result.bytes_by_kind(c).get("embed", 0) for c in range(devices))
    assert embed == plan.memory.rows * 16 * model.hidden_size * model.dtype.itemsize
    if devices > 1:
        assert all(e.src_dev != e.dst_dev for e in result.events if e.kind == "collective")
        # the collectives carry the valid rows only, in the wire dtype: exactly the plan's bytes
        for core in range(devices):
            assert result.bytes_by_kind(core)["collective"] == plan.collectives.remote_bytes(
                devices)


@pytest.mark.parametrize("dtype,wire_bytes", [("bfloat16", 2), ("float32", 4)])
def test_remote_copies_carry_the_valid_rows_in_the_wire_dtype(dtype, wire_bytes, tmp_path):
    """Issue 17: at batch 1 a one-shot all-reduce sends one row x hidden in the
    model's activation dtype (2 bytes for bf16, 4 for f32) to each peer, not
    the 8 padded rows and not f32 for a bf16 model; the trace's remote copies
    are exactly those bytes, and exactly the plan's."""
    import dataclasses

    model = build(dataclasses.replace(zoo.card("tiny-dense"), dtype=dtype))
    devices, h = 2, model.hidden_size
    plan = plan_model(model, devices=devices, batch=1, tokens=1)
    spec = plan.collectives.spec("allreduce")
    assert (plan.collectives.wire, spec.algorithm) == (dtype, "one_shot")
    assert spec.bytes_per_peer == spec.payload_bytes == 1 * h * wire_bytes
    slots = plan.memory.buffer("allreduce.slots")
    assert slots.dtype == dtype and slots.shape == (2, devices, 1, h)
    reductions = sum(site.per_step for site in plan.collectives.sites if site.spec == "allreduce")
    assert reductions == 1 + 2 * len(model.layers)     # embedding, then o_proj and MLP per layer
    argmax = 2 * 1 * 128 * 4                            # f32 max + int32 index, one row of lanes
    result = trace.trace_step(model, plan, init_weights(model), out_dir=tmp_path)
    for core in range(devices):
        sent = sorted(e.nbytes for e in result.events if e.kind == "collective"
                      and e.src_dev == core)
        assert sent == sorted([h * wire_bytes] * reductions + [argmax // 2] * 2)
        assert sum(sent) == plan.collectives.remote_bytes(devices)


def _routed_experts(model, weights, tokens, t):
    """{layer: set of expert ids} the reference's router picks in trace_step's
    logged step (the same tokens at positions t.., after a step at 0..)."""
    import jax.numpy as jnp

    from megakernel.models import kind_moe, reference

    picked, real_route = {}, kind_moe.route

    def recording(op, p, x, margins=None):
        ids, w = real_route(op, p, x, margins)
        picked.setdefault(len(picked), set()).update(np.asarray(ids).ravel().tolist())
        return ids, w

    w = reference.as_jax(weights)
    b = tokens.shape[0]
    caches = reference.init_caches(model, b)
    _, caches = reference.decode_step(model, w, jnp.asarray(tokens), jnp.zeros((b,), jnp.int32),
                                      caches)
    kind_moe.route = recording
    try:
        reference.decode_step(model, w, jnp.asarray(tokens), jnp.full((b,), t, jnp.int32), caches)
    finally:
        kind_moe.route = real_route
    moe_layers = [i for i, layer in enumerate(model.layers)
                  if any(n.op.kind == "moe" for n in layer.nodes)]
    return dict(zip(moe_layers, picked.values()))


@pytest.mark.parametrize("devices,moe_parallel", [(1, None), (2, None), (2, "ep")])
def test_moe_step_reads_each_routed_expert_once(devices, moe_parallel, tmp_path):
    model = zoo.model("tiny-moe")
    b, t = 3, 1
    overrides = {"moe_parallel": moe_parallel} if moe_parallel else None
    plan = plan_model(model, devices=devices, batch=b, tokens=t, overrides=overrides)
    weights = init_weights(model, seed=3)
    result = trace.trace_step(model, plan, weights, out_dir=tmp_path, seed=4)
    tokens = np.random.default_rng(4).integers(0, model.vocab_size, (b, t)).astype(np.int32)
    routed = _routed_experts(model, weights, tokens, t)
    # 3 rows x top-2 cannot pick all 8 experts: fetching unpicked ones would show
    assert set(routed) == {1, 2} and all(0 < len(s) <= 6 for s in routed.values())
    shards = shard_weights(model, plan.shard, weights)
    want_dense = trace.plan_weight_bytes(plan)
    for core in range(devices):
        got = result.bytes_by_kind(core)
        want = 0
        for layer, experts in routed.items():
            prefix = f"layers.{layer}.moe.experts_"
            region = plan.shard.param(prefix + "gate").source(core)[0]   # global expert ids
            for e in experts:
                if region.start <= e < region.stop:
                    want += sum(shards[core][prefix + m][e - region.start].nbytes
                                for m in ("gate", "up", "down"))
        assert got.get("experts", 0) == want, (core, routed)
        # everything else is streamed exactly as planned, as for dense models
        assert got["ring"] == want_dense["ring"]
        assert got["vector"] == want_dense["vector"]


def _in_flight_under(program, kinds=("kv",)) -> dict[int, list[str]]:
    """Per DMA of ``kinds`` (in start order): the kinds of the other DMAs the
    core waited for between starting it and waiting for it."""
    open_, out = {}, {}
    for op, dma, _, kind in program:
        if op == "start" and kind in kinds:
            open_[dma] = []
        elif op == "done":
            if dma in open_:
                out[dma] = open_.pop(dma)
            for waits in open_.values():
                waits.append(kind)
    return out


def _kv_dmas(model, library, sync, tmp_path, positions, window_bytes):
    """Trace one step of ``model`` (1 core, batch 2; the synchronised ablation
    if ``sync``) at ``positions(g)`` (g: the geometry of its ``library`` op):
    (``_in_flight_under`` of its KV DMAs, its window loads: DMAs into VMEM of
    ``window_bytes(g)``)."""
    from megakernel.backends.pallas_tpu.codegen.load import compile_model
    from megakernel.backends.pallas_tpu.codegen import load

    plan = plan_model(model, devices=1, batch=2, tokens=1)
    g = next(og.geometry for og in plan.memory.geometries if og.library == library)
    module = load.import_module(compile_model(model, plan, tmp_path, synchronised=sync))
    result = trace.trace_step(model, plan, init_weights(model), module=module,
                              positions=positions(g))
    assert result.unwaited == 0
    under = _in_flight_under(result.program(0))
    events = {e.order: e for e in result.events}
    loads = [d for d in under if events[d].dst == "vmem" and events[d].nbytes == window_bytes(g)]
    return under, loads


def _assert_off_the_critical_path(under, loads, first_loads, sync):
    if sync:   # no weight tile is consumed under a window load: it is waited inside the op
        assert all("ring" not in under[d] for d in loads), {d: under[d] for d in loads}
    else:
        assert all(under.values()), under
        assert all("ring" in under[d] for d in first_loads), {d: under[d] for d in first_loads}


@pytest.mark.parametrize("sync", [False, True], ids=["megakernel", "synchronised"])
def test_attention_dmas_leave_the_critical_path(sync, tmp_path):
    """Issue 17 item 2: every KV-cache DMA (window loads and stores, cache
    tiles) is in flight while the core waits for something else; each layer's
    first window load starts a layer ahead, so weight tiles are consumed under
    it. The synchronised ablation waits each at once (the control)."""
    model = zoo.model("tiny-dense")

    def start(g):   # sequence 0 reads two cache tiles before its window, sequence 1 none
        assert g.kv_tile + 40 + 16 <= g.max_seq_len
        return [g.kv_tile + 40, 3]

    under, loads = _kv_dmas(model, "attention", sync, tmp_path, start,
                            lambda g: g.width * 16 * 2)
    layers = len(model.layers)
    # per layer: 2 sequences x k|v window load and store, 2 tiles x k|v
    assert len(under) == layers * (4 * 2 + 2 * 2) and len(loads) == layers * 2 * 2
    first_loads = [d for i, d in enumerate(loads) if i % 4 < 2]    # sequence 0's k and v
    _assert_off_the_critical_path(under, loads, first_loads, sync)


def tiny_mla():
    """A small DeepSeek-like model (q LoRA, latent cache, dense MLP, bf16): the
    zoo's MLA models are full size."""
    return build(ModelConfig(
        name="tiny-mla", vocab_size=1024, hidden_size=256, num_layers=2, num_q_heads=4,
        num_kv_heads=4, head_dim=48, intermediate_size=512, max_seq_len=512,
        dtype="bfloat16", mla=MLAConfig(kv_lora_rank=128, qk_nope_head_dim=32,
                                        qk_rope_head_dim=16, v_head_dim=32, q_lora_rank=64)))


@pytest.mark.parametrize("sync", [False, True], ids=["megakernel", "synchronised"])
def test_mla_dmas_leave_the_critical_path(sync, tmp_path):
    """The same for multi-head latent attention: its latent windows and cache
    tiles stream under other work (mla.prefetch / attend / drain)."""
    from megakernel.backends.pallas_tpu.kernels.attention import window_rows

    model = tiny_mla()
    W = lambda g: window_rows(g)   # noqa: E731

    def start(g):   # sequence 0 reads a cache tile before its window, sequence 1 none
        assert 2 * W(g) <= g.max_seq_len and W(g) < g.kv_tile
        return [2 * W(g) + 3, 3]

    under, loads = _kv_dmas(model, "mla", sync, tmp_path, start,
                            lambda g: W(g) * g.latent * 2)
    layers = len(model.layers)
    # per layer: 2 sequences' window load and store, 1 latent tile
    assert len(under) == layers * (2 * 2 + 1) and len(loads) == layers * 2
    _assert_off_the_critical_path(under, loads, loads[::2], sync)   # [::2]: sequence 0's
