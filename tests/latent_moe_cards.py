"""Two tiny cards of the latent MoE (ir/kind_moe.py), shared by the tests of
every stage: Muse Spark's form and Kimi K3's, at widths that split evenly
over 2 cores (whole 128-lane expert widths under tensor parallelism)."""

import dataclasses

from megakernel.ir.config import ModelConfig, MoEConfig

_BASE = dict(vocab_size=512, hidden_size=256, num_layers=2, num_q_heads=4, num_kv_heads=2,
             head_dim=64, intermediate_size=512, norm_eps=1e-5, dtype="float32",
             max_seq_len=64)

# Muse Spark: an f32 sigmoid router on the full width with a logit scale and a
# selection bias, weights renormalised with eps 1e-15; the latent input normed
# by the card's (1 + w) norm; each expert's output input-scaled-normed (eps
# 1e-8) before it is weighted; no shared experts.
MUSE = ModelConfig(name="tiny-muse-moe", norm_offset=True, **_BASE, moe=MoEConfig(
    num_experts=8, top_k=2, expert_intermediate=256, scoring="sigmoid", correction_bias=True,
    renormalize=True, routed_scaling=1.5, latent_size=128, latent_input_norm=True,
    expert_output_norm="per_expert", expert_output_norm_eps=1e-8,
    expert_output_norm_input_scaled=True, router_logit_scale=2 ** -2.5,
    renormalize_eps=1e-15, router_f32=True))

# Kimi K3: the latent input unnormed, the weighted sum of the routed experts
# RMS-normed (plain, the card's eps) before the up projection, two shared
# experts on the full width added after it; a dense first layer.
KIMI = ModelConfig(name="tiny-kimi-moe", first_k_dense=1, **_BASE, moe=MoEConfig(
    num_experts=8, top_k=2, expert_intermediate=256, scoring="sigmoid", correction_bias=True,
    renormalize=True, routed_scaling=2.0, num_shared_experts=2, shared_intermediate=128,
    latent_size=128, expert_output_norm="weighted_sum"))


def in_dtype(card: ModelConfig, dtype: str) -> ModelConfig:
    return dataclasses.replace(card, dtype=dtype)
