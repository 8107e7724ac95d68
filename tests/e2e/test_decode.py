"""End to end: the generated megakernel vs the plain-JAX reference.

Each case plans a tiny model, emits and imports its kernel, then decodes a few
steps in strict TPU interpret mode (race detector on, out-of-bounds reads
raise) over 1, 2 or 4 virtual CPU devices, comparing greedy tokens, logits and
KV caches with the reference.
"""

import pytest

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import MLAConfig, ModelConfig, MoEConfig, build
from megakernel.models import zoo
from megakernel.models.weights import init_weights



def dense(dtype="float32", **kw):
    base = dict(name="e2e_dense", vocab_size=512, hidden_size=128, num_layers=2,
                num_q_heads=4, num_kv_heads=2, head_dim=128, intermediate_size=256,
                max_seq_len=64, dtype=dtype)
    return build(ModelConfig(**{**base, **kw}))


def moe(dtype="float32", **kw):
    base = dict(name="e2e_moe", vocab_size=512, hidden_size=128, num_layers=3,
                num_q_heads=4, num_kv_heads=2, head_dim=128, intermediate_size=256,
                max_seq_len=64, dtype=dtype, first_k_dense=1,
                moe=MoEConfig(num_experts=4, top_k=2, expert_intermediate=128,
                              scoring="sigmoid", correction_bias=True, renormalize=True,
                              routed_scaling=2.0, num_shared_experts=1,
                              shared_intermediate=128))
    return build(ModelConfig(**{**base, **kw}))


def mla(dtype="float32", **kw):
    """DeepSeek-V3-like: q LoRA, latent cache, YaRN, group-limited routing."""
    base = dict(name="e2e_mla", vocab_size=512, hidden_size=128, num_layers=3,
                num_q_heads=4, num_kv_heads=4, head_dim=48, intermediate_size=256,
                max_seq_len=64, dtype=dtype, first_k_dense=1, rope_scaling=YARN["rope_scaling"],
                mla=MLAConfig(kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
                              v_head_dim=32, q_lora_rank=64),
                moe=MoEConfig(num_experts=8, top_k=2, expert_intermediate=128,
                              scoring="sigmoid", correction_bias=True, renormalize=True,
                              routed_scaling=2.5, num_shared_experts=1, shared_intermediate=128,
                              n_group=4, topk_group=2))
    return build(ModelConfig(**{**base, **kw}))


# Kimi K3's MLA: no rotation (NoPE), a sigmoid output gate, no q LoRA.
KIMI_MLA = dict(rope_scaling=None, mla=MLAConfig(kv_lora_rank=64, qk_nope_head_dim=32,
                                                 qk_rope_head_dim=16, v_head_dim=24,
                                                 rope=False, output_gate=True))

VARIANT = dict(qk_norm=True, qkv_bias=True, o_bias=True, tie_embeddings=True,
               norm_offset=True, activation="gelu_tanh")

# YaRN: blended frequencies and cos/sin scaled by its attention factor (1.074 here).
YARN = dict(rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position": 16,
                          "mscale": 1.0, "mscale_all_dim": 0.6})

ROLLED_HEAD = {"bank_bytes": 128 * 1024, "num_banks": 3}
# Sliding and full attention alternating: one stack whose body is 2 layers.
PATTERN = dict(num_layers=4, sliding_window=4,
               layer_types=("sliding_attention", "full_attention") * 2)

CASES = [  # (id, model factory, devices, batch, tokens, steps[, plan overrides])
    ("dense-f32-1dev", lambda: dense(), 1, 2, 1, 2),
    ("dense-bf16-2dev-t2", lambda: dense("bfloat16"), 2, 3, 2, 2),
    ("dense-bf16-4dev", lambda: dense("bfloat16"), 4, 1, 1, 2),
    ("moe-f32-1dev", lambda: moe(), 1, 2, 1, 2),
    ("moe-bf16-2dev-t2", lambda: moe("bfloat16"), 2, 2, 2, 2),
    ("variant-f32-2dev", lambda: dense(**VARIANT), 2, 2, 1, 2),
    ("dense-bf16-2dev-rs_ag", lambda: dense("bfloat16", hidden_size=256), 2, 2, 1, 2,
     {"allreduce": "rs_ag"}),
    # small banks give the LM head many evenly stepped tiles: its fori_loop path
    ("rolled-head-f32-2dev", lambda: dense(vocab_size=5000, hidden_size=256, num_layers=1),
     2, 2, 1, 2, ROLLED_HEAD),
    ("pattern-f32-1dev", lambda: dense(**PATTERN), 1, 2, 1, 2),
    ("yarn-f32-1dev", lambda: dense(**YARN), 1, 2, 1, 2),
    # DeepSeek routing: 8 experts in 4 groups, the best 2 groups eligible
    ("moe-groups-f32-2dev", lambda: moe(moe=MoEConfig(
        num_experts=8, top_k=2, expert_intermediate=128, scoring="sigmoid",
        correction_bias=True, renormalize=True, routed_scaling=2.5, num_shared_experts=1,
        shared_intermediate=128, n_group=4, topk_group=2)), 2, 3, 1, 2),
    ("mla-f32-2dev-t2", lambda: mla(), 2, 2, 2, 2),
    ("mla-kimi-bf16-1dev-expanded", lambda: mla("bfloat16", **KIMI_MLA), 1, 3, 1, 2,
     {"mla_form": "expanded"}),
    ("pattern-bf16-2dev-t2", lambda: dense("bfloat16", **PATTERN), 2, 2, 2, 2),
    ("rolled-tied-head-f32-1dev", lambda: dense(vocab_size=5000, hidden_size=256, num_layers=1,
                                                tie_embeddings=True), 1, 2, 1, 2, ROLLED_HEAD),
    # the tied head is its own transposed copy: the embedding may stay whole, and
    # each core then gathers every row itself (it gathered only its vocab slice)
    ("tied-replicated-embed-bf16-2dev", lambda: dense("bfloat16", tie_embeddings=True), 2, 2,
     1, 2, {"embed": "replicated"}),
]
SLOW = [
    ("dense-bf16-4dev-b4-t2", lambda: dense("bfloat16", num_layers=3), 4, 4, 2, 3),
    ("moe-bf16-4dev-b4", lambda: moe("bfloat16"), 4, 4, 1, 3),
    ("moe-f32-2dev-softmax", lambda: moe(moe=MoEConfig(num_experts=4, top_k=1,
                                                       expert_intermediate=128)), 2, 2, 2, 2),
    ("zoo-tiny-moe-4dev", lambda: zoo.model("tiny-moe"), 4, 2, 1, 2),
    ("zoo-tiny-dense-2dev-t2", lambda: zoo.model("tiny-dense"), 2, 2, 2, 3),
]


def _case(c):
    return (*c[1:6], c[6] if len(c) > 6 else None)


def _check(make, devices, batch, tokens, steps, overrides, tmp_path):
    model = make()
    plan = plan_model(model, devices=devices, batch=batch, tokens=tokens, overrides=overrides)
    result = check_kernel(model, plan, init_weights(model, seed=1), steps=steps, seed=2,
                           out_dir=tmp_path)
    assert not result.races
    assert result.token_agreement == 1.0, result
    assert result.max_abs_err <= result.tolerance, result
    assert result.cache_max_err <= result.cache_tolerance, result
    assert result.ok, result


@pytest.mark.parametrize("make,devices,batch,tokens,steps,overrides",
                         [_case(c) for c in CASES], ids=[c[0] for c in CASES])
def test_decode_matches_reference(make, devices, batch, tokens, steps, overrides, tmp_path):
    _check(make, devices, batch, tokens, steps, overrides, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("make,devices,batch,tokens,steps,overrides",
                         [_case(c) for c in SLOW], ids=[c[0] for c in SLOW])
def test_decode_matches_reference_slow(make, devices, batch, tokens, steps, overrides,
                                       tmp_path):
    _check(make, devices, batch, tokens, steps, overrides, tmp_path)
