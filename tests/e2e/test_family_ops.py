"""The op options of issue 15's families decoded through the kernel in strict
interpret mode against the reference, on splits the HF fixtures do not reach:
gpt-oss's biased, clamped MoE with experts spread over cores (each adds its
own experts' down biases) or split along their width (one core of each split
adds them), chunked expert slots; OLMo 2's norm over all heads with its mean
of squares all-reduced one-shot over 4 cores and by reduce-scatter +
all-gather over 2."""

import dataclasses

import pytest

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.compiler.pipeline import plan_model
from megakernel.compiler.request import Overrides
from megakernel.ir.config import ModelConfig, MoEConfig, build
from megakernel.ir.ops import RopeScaling
from megakernel.models.weights import init_weights

OSS = ModelConfig(
    name="tiny-oss", vocab_size=512, hidden_size=256, num_layers=2, num_q_heads=4,
    num_kv_heads=2, head_dim=64, intermediate_size=512, qkv_bias=True, o_bias=True,
    sliding_window=3, layer_types=("sliding_attention", "full_attention"),
    rope_theta=1.5e5, rope_scaling=RopeScaling("yarn", 32.0, original_max_position=64,
                                               truncate=False),
    attention_sinks=True, attn_logit_softcap=8.0, dtype="float32", max_seq_len=64,
    moe=MoEConfig(4, 2, 512, renormalize=True, router_logit_bias=True, expert_bias=True,
                  swiglu_limit=1.0, swiglu_alpha=1.702))

OLMO = ModelConfig(
    name="tiny-olmo", vocab_size=512, hidden_size=256, num_layers=2, num_q_heads=4,
    num_kv_heads=4, head_dim=64, intermediate_size=512, qk_norm=True,
    qk_norm_all_heads=True, pre_norms=False, post_norms=True, scale_embeddings=True,
    norm_offset=True, dtype="float32", max_seq_len=64)


def _check(card, devices, tmp_path, **overrides):
    model = build(card)
    plan = plan_model(model, devices=devices, batch=2, tokens=1,
                      overrides=Overrides(**overrides))
    result = check_kernel(model, plan, init_weights(model, seed=5), steps=2, seed=6,
                           out_dir=tmp_path)
    assert not result.races and result.token_agreement == 1.0, result
    assert result.max_abs_err <= result.tolerance, result
    return plan


@pytest.mark.parametrize("parallel", ["ep", "tp"])
def test_gpt_oss_moe_over_two_cores(parallel, tmp_path):
    plan = _check(OSS, 2, tmp_path, moe_parallel=parallel, slot_chunks=2)
    (_, ep, tp, _, _), = plan.shard.stacks[0].experts
    assert (ep, tp) == ((2, 1) if parallel == "ep" else (1, 2))
    assert all(e.chunks == 2 for e in plan.memory.experts)


def test_norm_over_all_heads_on_four_cores(tmp_path):
    plan = _check(OLMO, 4, tmp_path)
    consumers = {r.consumer for r in plan.shard.stacks[0].reductions}
    assert {"q_norm", "k_norm", "post_attn_norm", "post_ffn_norm"} <= consumers


@pytest.mark.slow
def test_norm_over_all_heads_by_reduce_scatter_in_bf16(tmp_path):
    card = dataclasses.replace(OLMO, dtype="bfloat16")
    plan = _check(card, 2, tmp_path, allreduce="rs_ag")
    assert plan.collectives.spec("allreduce").algorithm == "rs_ag"
